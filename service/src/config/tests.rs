use serde::{Deserialize, Serialize};

use super::keys::{self, KeyDoc, Section};
use super::*;
use toml::Table;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Raw {
    name: String,
    count: u64,
    rate: f64,
    on: bool,
    timeout_ms: u64,
    nats: Nats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Nats {
    url: String,
    token: String,
}

impl Default for Raw {
    fn default() -> Self {
        Self {
            name: "weir".to_owned(),
            count: 4,
            rate: 1.5,
            on: false,
            timeout_ms: 500,
            nats: Nats::default(),
        }
    }
}

impl Default for Nats {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            token: String::new(),
        }
    }
}

const PREFIX: &str = "WEIR_TEST_";

fn env(vars: &[(&str, &str)]) -> Layers {
    let mut layers = Layers::new(&Raw::default());
    layers.env(
        PREFIX,
        vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        &["LOG_FORMAT"],
    );
    layers
}

#[test]
fn precedence_is_file_then_environment_then_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "count = 10\ntimeout_ms = 700\nname = \"file\"\n[nats]\nurl = \"nats://file:4222\"\n",
    )
    .expect("write");
    let mut layers = Layers::new(&Raw::default());
    layers.file(&path).expect("file");
    layers.env(
        PREFIX,
        [
            ("WEIR_TEST_COUNT".to_owned(), "20".to_owned()),
            ("WEIR_TEST_TIMEOUT_MS".to_owned(), "800".to_owned()),
        ],
        &[],
    );
    layers.set_text("count", "30", Origin::CommandLine);
    let raw: Raw = layers.build().expect("valid");
    assert_eq!(raw.count, 30, "the command line wins");
    assert_eq!(raw.timeout_ms, 800, "the environment beats the file");
    assert_eq!(raw.name, "file", "the file beats the default");
    assert_eq!(raw.nats.url, "nats://file:4222");
    assert_eq!(raw.rate, 1.5, "the default stays");
    assert_eq!(layers.origin("count"), &Origin::CommandLine);
    assert_eq!(
        layers.origin("timeout_ms"),
        &Origin::Env("WEIR_TEST_TIMEOUT_MS".to_owned())
    );
    assert_eq!(layers.origin("nats.url"), &Origin::File(path));
    assert_eq!(layers.origin("rate"), &Origin::Default);
}

#[test]
fn text_values_take_the_type_of_the_default() {
    let raw: Raw = env(&[
        // A string key keeps a numeric-looking value as text, spaces included.
        ("WEIR_TEST_NAME", "0123"),
        ("WEIR_TEST_NATS__TOKEN", " 42 "),
        // Booleans: true/false, 1/0, yes/no.
        ("WEIR_TEST_ON", "yes"),
        // Integers (durations in ms) in TOML syntax, trimmed.
        ("WEIR_TEST_TIMEOUT_MS", " 1_000 "),
        // A decimal key takes an integer.
        ("WEIR_TEST_RATE", "2"),
        ("WEIR_TEST_LOG_FORMAT", "json"),
        ("OTHER_COUNT", "x"),
    ])
    .build()
    .expect("valid");
    assert_eq!(raw.name, "0123");
    assert_eq!(raw.nats.token, " 42 ");
    assert!(raw.on);
    assert_eq!(raw.timeout_ms, 1_000);
    assert_eq!(raw.rate, 2.0);
    for (text, want) in [("true", true), ("1", true), ("false", false), ("0", false)] {
        let raw: Raw = env(&[("WEIR_TEST_ON", text)]).build().expect(text);
        assert_eq!(raw.on, want, "{text}");
    }
    let raw: Raw = env(&[("WEIR_TEST_RATE", "0.25")]).build().expect("decimal");
    assert_eq!(raw.rate, 0.25);
}

#[test]
fn wrong_types_name_the_key_the_origin_and_the_expected_type() {
    for (var, text, key) in [
        ("WEIR_TEST_TIMEOUT_MS", "500ms", "timeout_ms"),
        ("WEIR_TEST_COUNT", "lots", "count"),
        ("WEIR_TEST_ON", "maybe", "on"),
        ("WEIR_TEST_RATE", "fast", "rate"),
    ] {
        let err = env(&[(var, text)]).build::<Raw>().expect_err(text);
        assert_eq!(
            (err.key(), err.kind()),
            (key, ConfigErrorKind::WrongType),
            "{err}"
        );
        assert_eq!(err.origin(), &Origin::Env(var.to_owned()));
        assert!(err.to_string().contains(var), "{err}");
        assert!(err.to_string().contains("expected"), "{err}");
    }
    let err = env(&[("WEIR_TEST_COUNT", "lots")])
        .build::<Raw>()
        .expect_err("type");
    assert!(
        err.to_string().contains("expected a non-negative integer"),
        "{err}"
    );
    let mut layers = Layers::new(&Raw::default());
    layers.set_text("count", "-5", Origin::CommandLine);
    let err = layers.build::<Raw>().expect_err("negative");
    assert_eq!((err.key(), err.kind()), ("count", ConfigErrorKind::Invalid));
    assert!(err.to_string().contains("the command line"), "{err}");
}

#[test]
fn unknown_keys_are_refused_from_every_layer() {
    let err = env(&[("WEIR_TEST_COUTN", "1")])
        .build::<Raw>()
        .expect_err("env typo");
    assert_eq!(
        (err.key(), err.kind()),
        ("coutn", ConfigErrorKind::UnknownKey)
    );
    assert_eq!(err.origin(), &Origin::Env("WEIR_TEST_COUTN".to_owned()));
    assert!(
        err.to_string().contains("WEIR_TEST_COUTN") && err.to_string().contains("`count`"),
        "{err}"
    );
    let err = env(&[("WEIR_TEST_NATS__URLS", "x")])
        .build::<Raw>()
        .expect_err("nested typo");
    assert_eq!(err.key(), "nats.urls");
    assert!(err.to_string().contains("`nats.url`"), "{err}");

    let mut layers = Layers::new(&Raw::default());
    layers.set_text("colour", "red", Origin::CommandLine);
    let err = layers.build::<Raw>().expect_err("flag");
    assert_eq!(
        (err.key(), err.kind()),
        ("colour", ConfigErrorKind::UnknownKey)
    );
    assert!(!err.to_string().contains("did you mean"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[section]\nx = 1\n").expect("write");
    let mut layers = Layers::new(&Raw::default());
    layers.file(&path).expect("TOML");
    let err = layers.build::<Raw>().expect_err("file");
    assert_eq!(
        (err.key(), err.kind()),
        ("section", ConfigErrorKind::UnknownKey)
    );
    assert!(err.to_string().contains("c.toml"), "{err}");

    // An empty known section keeps its defaults; an empty unknown one is refused.
    std::fs::write(&path, "[nats]\n").expect("write");
    let mut layers = Layers::new(&Raw::default());
    layers.file(&path).expect("TOML");
    let raw: Raw = layers.build().expect("empty section");
    assert_eq!(raw.nats, Nats::default());
    std::fs::write(&path, "[natz]\n").expect("write");
    let mut layers = Layers::new(&Raw::default());
    layers.file(&path).expect("TOML");
    let err = layers.build::<Raw>().expect_err("unknown section");
    assert_eq!(err.key(), "natz");
    assert!(err.to_string().contains("did you mean `nats`?"), "{err}");

    std::fs::write(&path, "count = ").expect("write");
    let err = Layers::new(&Raw::default())
        .file(&path)
        .expect_err("not TOML");
    assert_eq!(err.kind(), ConfigErrorKind::File);
    let err = Layers::new(&Raw::default())
        .file(&dir.path().join("missing.toml"))
        .expect_err("missing");
    assert_eq!(err.kind(), ConfigErrorKind::File);
}

#[test]
fn the_key_table_comes_from_the_defaults() {
    const DOCS: &[KeyDoc] = &[
        KeyDoc {
            name: "count",
            range: Range::int(1, 8),
            help: "how many | or fewer",
        },
        KeyDoc {
            name: "nats.token",
            range: Range::Any,
            help: "token",
        },
    ];
    let section = Section {
        extra: &[],
        name: "test",
        keys: DOCS,
    };
    let layers = Layers::new(&Raw::default());
    let rows = keys::rows(&layers, &section);
    assert_eq!(rows[0].ty, "integer");
    assert_eq!(rows[0].default.as_deref(), Some("4"));
    assert_eq!(rows[1].default, None, "an empty string is unset");
    let md = keys::markdown(&rows);
    assert!(
        md.contains("| `count` | integer | `4` | 1..=8 | how many \\| or fewer |"),
        "{md}"
    );
    assert!(md.contains("| `nats.token` | string | — |"), "{md}");
    assert!(keys::text(&rows).contains("(unset)"));
    let (undocumented, extra) = keys::uncovered(&layers, &[section]);
    assert_eq!(
        undocumented,
        ["name", "nats.url", "on", "rate", "timeout_ms"]
    );
    assert!(extra.is_empty());
    let doc = "intro\n<!-- keys:test -->\n| a |\n<!-- /keys:test -->\n";
    assert_eq!(keys::docs_section(doc, "test"), Some("| a |\n"));
    assert_eq!(keys::docs_section(doc, "other"), None);
}

#[test]
fn did_you_mean_is_within_two_edits() {
    assert_eq!(edit_distance("max_byte", "max_bytes"), 1);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "abc"), 3);
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct WithArray {
    count: u64,
    /// Unset by default: resolved from `count` by the service.
    follows: Option<u64>,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Rule {
    key: String,
    limit: u64,
}

fn with_array() -> Layers {
    let schema = WithArray {
        follows: Some(0),
        rules: vec![Rule::default()],
        ..WithArray::default()
    };
    Layers::new(&WithArray::default()).with_schema(&schema)
}

#[test]
fn arrays_of_tables_are_addressed_per_element() {
    let mut layers = with_array();
    let file: Table = "[[rules]]\nkey = \"a\"\nlimit = 1\n[[rules]]\nkey = \"b\"\nlimit = 2\n"
        .parse()
        .expect("toml");
    layers.table(&file, &Origin::File("c.toml".into()));
    assert_eq!(
        layers.origin("rules[1].limit"),
        &Origin::File("c.toml".into())
    );
    // Text takes the element field's type from the schema: `7` stays a string key's
    // text, `3` is an integer for `limit`.
    layers.set_text("rules[1].limit", "3", Origin::CommandLine);
    layers.set_text("rules[2].key", "7", Origin::CommandLine);
    layers.set_text("follows", "9", Origin::CommandLine);
    let raw: WithArray = layers.build().expect("valid");
    assert_eq!(raw.follows, Some(9));
    assert_eq!(
        raw.rules,
        [
            Rule {
                key: "a".into(),
                limit: 1
            },
            Rule {
                key: "b".into(),
                limit: 3
            },
            Rule {
                key: "7".into(),
                limit: 0
            },
        ]
    );
    assert_eq!(
        with_array().build::<WithArray>().expect("defaults").follows,
        None
    );

    // A refused element value is named with its index, an unknown one with a hint.
    let mut layers = with_array();
    let file: Table = "[[rules]]\nkey = \"a\"\n[[rules]]\nlimit = -3\n"
        .parse()
        .expect("toml");
    layers.table(&file, &Origin::File("c.toml".into()));
    let err = layers.build::<WithArray>().expect_err("negative");
    assert_eq!(
        (err.key(), err.kind()),
        ("rules[1].limit", ConfigErrorKind::Invalid),
        "{err}"
    );
    let mut layers = with_array();
    layers.set_text("rules[0].limits", "3", Origin::CommandLine);
    let err = layers.build::<WithArray>().expect_err("unknown");
    assert_eq!(
        (err.key(), err.kind()),
        ("rules[0].limits", ConfigErrorKind::UnknownKey),
        "{err}"
    );
    assert!(err.to_string().contains("`rules[].limit`"), "{err}");
}

#[test]
fn the_key_table_lists_element_and_unset_keys_from_the_schema() {
    const DOCS: &[KeyDoc] = &[
        KeyDoc {
            name: "count",
            range: Range::Any,
            help: "",
        },
        KeyDoc {
            name: "follows",
            range: Range::Any,
            help: "default: = count",
        },
        KeyDoc {
            name: "rules[].key",
            range: Range::Any,
            help: "",
        },
        KeyDoc {
            name: "rules[].limit",
            range: Range::Any,
            help: "",
        },
    ];
    let section = Section {
        extra: &[],
        name: "t",
        keys: DOCS,
    };
    let layers = with_array();
    let rows = keys::rows(&layers, &section);
    let shown: Vec<(&str, &str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.ty, r.default.as_deref()))
        .collect();
    assert_eq!(
        shown,
        [
            ("count", "integer", Some("0")),
            ("follows", "integer", None),
            ("rules[].key", "string", None),
            ("rules[].limit", "integer", Some("0")),
        ]
    );
    let (undocumented, extra) = keys::uncovered(&layers, &[section]);
    assert!(
        undocumented.is_empty() && extra.is_empty(),
        "{undocumented:?} {extra:?}"
    );
}

#[test]
fn a_renamed_key_loads_under_its_old_name_with_a_warning_naming_the_new_one() {
    static ALIASES: &[Alias] = &[
        Alias::new("nats_url", "nats.url"),
        Alias::new("total", "count"),
    ];
    let mut layers = Layers::new(&Raw::default()).with_aliases(ALIASES);
    layers.env(
        PREFIX,
        [("WEIR_TEST_NATS_URL".to_owned(), "nats://h:1".to_owned())],
        &[],
    );
    layers.set_text("total", "7", Origin::CommandLine);
    let raw: Raw = layers.build().expect("loads");
    assert_eq!((raw.nats.url.as_str(), raw.count), ("nats://h:1", 7));
    let shown: Vec<String> = layers.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert!(
        shown[0].contains("`nats_url`") && shown[0].contains("`nats.url`"),
        "{shown:?}"
    );
    assert!(shown[0].contains("WEIR_TEST_NATS_URL"), "{shown:?}");
    assert_eq!(layers.warnings()[1].keys(), ["total", "count"]);
    // The new name alone: no warning.
    let mut layers = Layers::new(&Raw::default()).with_aliases(ALIASES);
    layers.set_text("nats.url", "nats://h:2", Origin::CommandLine);
    assert!(layers.warnings().is_empty());
}
