//! Every way [`NatsAuth`] and [`NatsTls`] let a weir client authenticate, through
//! `weir_service::nats::{options, connect}` against a real `nats-server` configured for
//! that method: user and password, token, NKey, a `.creds` file (operator mode: an
//! operator, account and user made here with `nkeys` and hand-signed JWTs, the account
//! preloaded into a `MEMORY` resolver), TLS with a CA generated per test (`rcgen`), and
//! mutual TLS (the server requires a client certificate signed by that CA).
//!
//! Each case proves two things: the right credential connects and can publish and
//! receive on the connection, and the wrong one (or none) is refused at once with an
//! error whose kind the caller can match and whose text says why (the async-nats error
//! stays reachable as its `source()`).
//!
//! Each test starts its own server (`nats-server -c <generated file> -a 127.0.0.1 -p -1
//! --ports_file_dir <dir>`: the server picks a free loopback port and reports it in its
//! ports file) and kills it on drop. The binary is `NATS_SERVER_BIN`, else
//! `nats-server` on PATH.

use std::fs;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::StreamExt;
use nkeys::KeyPair;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyUsagePurpose};
use serde_json::json;
use weir_service::nats::{ConnectError, ConnectErrorKind, NatsAuth, NatsConfig, NatsTls};

/// How long a server may take to report its port.
const STARTUP: Duration = Duration::from_secs(10);

/// One `nats-server` process with a generated configuration, killed on drop.
struct Server {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts a server with `config` (the server's configuration-file text) in `dir`.
    fn start(dir: tempfile::TempDir, config: &str) -> Self {
        let conf = dir.path().join("server.conf");
        fs::write(&conf, config).expect("write server.conf");
        let ports = dir.path().join("ports");
        fs::create_dir_all(&ports).expect("ports dir");
        let log = fs::File::create(dir.path().join("server.log")).expect("log file");
        let bin = std::env::var_os("NATS_SERVER_BIN")
            .filter(|b| !b.is_empty())
            .map_or_else(|| PathBuf::from("nats-server"), PathBuf::from);
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&conf)
            .args(["-a", "127.0.0.1", "-p", "-1", "--ports_file_dir"])
            .arg(&ports)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut server = Self {
            child,
            port: 0,
            dir,
        };
        server.port = server.wait_ready(&ports);
        server
    }

    /// Polls the ports file until it names the client port and the port accepts.
    fn wait_ready(&mut self, ports: &Path) -> u16 {
        let file = ports.join(format!("nats-server_{}.ports", self.child.id()));
        let deadline = Instant::now() + STARTUP;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("nats-server exited ({status}):\n{}", self.log());
            }
            let port = fs::read_to_string(&file).ok().and_then(|t| client_port(&t));
            if let Some(port) = port {
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                if TcpStream::connect_timeout(&addr, Duration::from_millis(250)).is_ok() {
                    return port;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("nats-server not ready within {STARTUP:?}:\n{}", self.log());
    }

    /// `nats://127.0.0.1:<port>`.
    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = fs::File::open(self.dir.path().join("server.log")) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The client port of a ports file: `{"nats":["nats://127.0.0.1:PORT"],...}` (`tls://`
/// with TLS). `None` while the file is incomplete.
fn client_port(text: &str) -> Option<u16> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let url = v["nats"].as_array()?.first()?.as_str()?;
    url.rsplit_once(':')?.1.parse().ok()
}

/// A server whose `authorization` block (or other top-level settings) is `config`.
fn server_with(config: &str) -> Server {
    Server::start(tempfile::tempdir().expect("tempdir"), config)
}

/// Connects through weir's one connect path with `auth` and `tls`.
async fn connect(
    url: &str,
    auth: NatsAuth,
    tls: NatsTls,
) -> Result<async_nats::Client, ConnectError> {
    let cfg = NatsConfig {
        auth,
        tls,
        ..NatsConfig::for_url("weir-nats-auth-test", url)
    };
    let opts = weir_service::nats::options(&cfg).await?;
    weir_service::nats::connect(&cfg, opts).await
}

/// Connects and proves the connection works: a message published on it comes back
/// through a subscription on it.
async fn connects(server: &Server, auth: NatsAuth, tls: NatsTls) {
    let client = connect(&server.url(), auth, tls)
        .await
        .unwrap_or_else(|e| panic!("refused: {e}\nserver log:\n{}", server.log()));
    let mut sub = client.subscribe("weir.auth.test").await.expect("subscribe");
    client.flush().await.expect("flush");
    client
        .publish("weir.auth.test", "hello".into())
        .await
        .expect("publish");
    let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("message within 5 s")
        .expect("subscription open");
    assert_eq!(&msg.payload[..], b"hello");
}

/// Connects with a wrong credential and checks the refusal: weir's `Connect` kind, the
/// async-nats error as the source with kind `want`, and a message naming the server
/// and the reason. Returns the message.
async fn refused(
    server: &Server,
    auth: NatsAuth,
    tls: NatsTls,
    want: &[async_nats::ConnectErrorKind],
) -> String {
    let started = Instant::now();
    let err = match connect(&server.url(), auth, tls).await {
        Ok(_) => panic!("a wrong credential connected"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ConnectErrorKind::Connect, "{err}");
    let source = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<async_nats::ConnectError>())
        .unwrap_or_else(|| panic!("no async-nats source: {err:?}"));
    assert!(want.contains(&source.kind()), "{:?}: {err}", source.kind());
    let text = err.to_string();
    assert!(text.contains(&server.url()), "names the server: {text}");
    // Refused by the server, not given up on after the connection timeout.
    assert!(started.elapsed() < Duration::from_secs(5), "{text}");
    eprintln!("refused as expected: {text}");
    text
}

#[tokio::test]
async fn user_and_password() {
    let server = server_with(r#"authorization { user: "weir", password: "s3cret-pw" }"#);
    let auth = |password: &str| NatsAuth::UserPassword {
        user: "weir".into(),
        password: password.into(),
    };
    connects(&server, auth("s3cret-pw"), NatsTls::default()).await;
    let violation = [async_nats::ConnectErrorKind::AuthorizationViolation];
    let text = refused(&server, auth("wrong"), NatsTls::default(), &violation).await;
    assert!(text.contains("authorization violation"), "{text}");
    refused(&server, NatsAuth::None, NatsTls::default(), &violation).await;
}

#[tokio::test]
async fn token() {
    let server = server_with(r#"authorization { token: "t0ken-abc" }"#);
    connects(
        &server,
        NatsAuth::Token("t0ken-abc".into()),
        NatsTls::default(),
    )
    .await;
    let violation = [async_nats::ConnectErrorKind::AuthorizationViolation];
    let wrong = NatsAuth::Token("t0ken-xyz".into());
    let text = refused(&server, wrong, NatsTls::default(), &violation).await;
    assert!(text.contains("authorization violation"), "{text}");
}

#[tokio::test]
async fn nkey() {
    let user = KeyPair::new_user();
    let server = server_with(&format!(
        r#"authorization {{ users: [ {{ nkey: "{}" }} ] }}"#,
        user.public_key()
    ));
    let seed = user.seed().expect("seed");
    connects(&server, NatsAuth::NKey(seed), NatsTls::default()).await;
    let other = KeyPair::new_user().seed().expect("seed");
    let violation = [async_nats::ConnectErrorKind::AuthorizationViolation];
    let text = refused(
        &server,
        NatsAuth::NKey(other),
        NatsTls::default(),
        &violation,
    )
    .await;
    assert!(text.contains("authorization violation"), "{text}");
}

/// A JWT as nats-server reads it (`alg: ed25519-nkey`): the claims `iss`, `sub`, `name`,
/// `iat`, `jti` and `nats` (the type-specific part), signed by `issuer` over
/// `header.claims`, base64url without padding.
fn jwt(issuer: &KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let claims = json!({
        "jti": format!("{name}-{iat}-{subject}"),
        "iat": iat,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let sig = issuer.sign(signed.as_bytes()).expect("sign");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig))
}

/// An operator (self-signed) and one account it signed, preloaded into the server's
/// memory resolver.
struct Operator {
    operator_jwt: String,
    account: KeyPair,
    account_jwt: String,
}

impl Operator {
    fn new() -> Self {
        let operator = KeyPair::new_operator();
        let operator_jwt = jwt(
            &operator,
            &operator.public_key(),
            "weir-test-operator",
            json!({"type": "operator", "version": 2}),
        );
        let account = KeyPair::new_account();
        let account_jwt = account_jwt(&operator, &account);
        Self {
            operator_jwt,
            account,
            account_jwt,
        }
    }

    fn server_config(&self, dir: &Path) -> String {
        let op = dir.join("operator.jwt");
        fs::write(&op, &self.operator_jwt).expect("operator jwt");
        format!(
            "operator: \"{}\"\nresolver: MEMORY\nresolver_preload: {{\n  {}: \"{}\"\n}}\n",
            op.display(),
            self.account.public_key(),
            self.account_jwt
        )
    }
}

/// An account JWT without limits (`-1` is unlimited; an absent limit would be zero).
fn account_jwt(operator: &KeyPair, account: &KeyPair) -> String {
    let unlimited = json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1
    });
    jwt(
        operator,
        &account.public_key(),
        "weir-test-account",
        json!({"limits": unlimited, "type": "account", "version": 2}),
    )
}

/// A `.creds` file for a new user of `account`: the user JWT and the user's seed, in
/// the framing `nsc` writes.
fn creds_file(dir: &Path, name: &str, account: &KeyPair) -> PathBuf {
    let user = KeyPair::new_user();
    let user_jwt = jwt(
        account,
        &user.public_key(),
        "weir-test-user",
        json!({
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user", "version": 2
        }),
    );
    let text = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n",
        user.seed().expect("seed")
    );
    let path = dir.join(name);
    fs::write(&path, text).expect("creds file");
    path
}

#[tokio::test]
async fn creds_file_in_operator_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let op = Operator::new();
    let config = op.server_config(dir.path());
    let good = creds_file(dir.path(), "user.creds", &op.account);
    // A user of an account the server's operator never signed.
    let stranger = creds_file(dir.path(), "stranger.creds", &KeyPair::new_account());
    let server = Server::start(dir, &config);
    connects(&server, NatsAuth::CredsFile(good), NatsTls::default()).await;
    let violation = [async_nats::ConnectErrorKind::AuthorizationViolation];
    let text = refused(
        &server,
        NatsAuth::CredsFile(stranger),
        NatsTls::default(),
        &violation,
    )
    .await;
    assert!(text.contains("authorization violation"), "{text}");
    refused(&server, NatsAuth::None, NatsTls::default(), &violation).await;
}

#[tokio::test]
async fn a_missing_creds_file_is_an_options_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent.creds");
    let err = match connect(
        "nats://127.0.0.1:1",
        NatsAuth::CredsFile(missing),
        NatsTls::default(),
    )
    .await
    {
        Ok(_) => panic!("connected without a credentials file"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ConnectErrorKind::Options, "{err}");
    assert!(err.to_string().contains("absent.creds"), "{err}");
}

/// A CA, a server certificate for `localhost` and `127.0.0.1`, and a client
/// certificate, as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    fn new(dir: &Path, tag: &str) -> Self {
        let write = |name: &str, pem: String| {
            let p = dir.join(format!("{tag}-{name}"));
            fs::write(&p, pem).expect("pem");
            p
        };
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("weir test CA {tag}"));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        let issuer = Issuer::new(ca, ca_key);
        let server_key = rcgen::KeyPair::generate().expect("key");
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let server_cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&server_key, &issuer)
            .expect("server cert");
        let client_key = rcgen::KeyPair::generate().expect("key");
        let mut cp = CertificateParams::new(vec!["weir-client".to_owned()]).expect("params");
        cp.distinguished_name
            .push(DnType::CommonName, "weir-client");
        let client_cert = cp.signed_by(&client_key, &issuer).expect("client cert");
        Self {
            ca: write("ca.pem", ca_cert.pem()),
            server_cert: write("server.pem", server_cert.pem()),
            server_key: write("server.key", server_key.serialize_pem()),
            client_cert: write("client.pem", client_cert.pem()),
            client_key: write("client.key", client_key.serialize_pem()),
        }
    }

    /// The server's `tls` block; `verify` requires a client certificate.
    fn server_config(&self, verify: bool) -> String {
        format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: {verify}\n  timeout: 2\n}}\n",
            self.server_cert.display(),
            self.server_key.display(),
            self.ca.display()
        )
    }

    /// TLS trusting this CA, with or without the client certificate.
    fn client(&self, with_cert: bool) -> NatsTls {
        NatsTls {
            required: true,
            ca_file: Some(self.ca.clone()),
            client_cert: with_cert.then(|| (self.client_cert.clone(), self.client_key.clone())),
        }
    }
}

/// What a refused TLS connection surfaces as: async-nats reports a failed handshake
/// (`invalid peer certificate: UnknownIssuer`) and the server's alert about the client
/// certificate (`received fatal alert: BadCertificate`) as I/O errors; `Tls` is its
/// kind for a TLS setup error.
const TLS_REFUSALS: [async_nats::ConnectErrorKind; 2] = [
    async_nats::ConnectErrorKind::Tls,
    async_nats::ConnectErrorKind::Io,
];

#[tokio::test]
async fn tls_with_a_generated_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "a");
    let other = Pki::new(dir.path(), "b");
    let config = pki.server_config(false);
    let server = Server::start(dir, &config);
    connects(&server, NatsAuth::None, pki.client(false)).await;
    // A client that trusts another CA refuses the server's certificate.
    let text = refused(&server, NatsAuth::None, other.client(false), &TLS_REFUSALS).await;
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    // A client that does not ask for TLS is refused too: the server requires it.
    let plain = refused(
        &server,
        NatsAuth::None,
        NatsTls {
            required: false,
            ca_file: Some(other.ca.clone()),
            client_cert: None,
        },
        &TLS_REFUSALS,
    )
    .await;
    assert!(plain.to_lowercase().contains("certificate"), "{plain}");
}

#[tokio::test]
async fn mutual_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "a");
    let other = Pki::new(dir.path(), "b");
    let config = pki.server_config(true);
    let server = Server::start(dir, &config);
    connects(&server, NatsAuth::None, pki.client(true)).await;
    // No client certificate.
    let text = refused(&server, NatsAuth::None, pki.client(false), &TLS_REFUSALS).await;
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    // A client certificate from a CA the server does not trust.
    let stranger = NatsTls {
        client_cert: Some((other.client_cert.clone(), other.client_key.clone())),
        ..pki.client(false)
    };
    let text = refused(&server, NatsAuth::None, stranger, &TLS_REFUSALS).await;
    assert!(text.to_lowercase().contains("certificate"), "{text}");
}
