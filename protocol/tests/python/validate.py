#!/usr/bin/env python3
"""Validates JSON instances against the wire contracts' JSON Schemas (protocol/schemas),
for protocol/tests/it/schemas.rs. Needs the `jsonschema` package (pinned by
scripts/ensure-python-env).

    python3 validate.py < cases   # one JSON object per line:
                                  #   {"schema": "llm-error-body", "label": "...", "instance": ...}
                                  # prints one JSON object per case, in input order:
                                  #   {"schema": ..., "label": ..., "errors": [...]}

`errors` is empty when the instance is valid, else every violation ("message at /path"),
the most relevant (jsonschema's `best_match`) first.

Each schema is `protocol/schemas/<schema>.json`, which must declare draft 2020-12 and be
a valid schema; it is checked with `Draft202012Validator`. `format` is an annotation
only (no format checker, the draft 2020-12 default): the schemas carry schemars' numeric
formats (`uint64`, `double`, ...), which no validator knows; `type` and `minimum` say
what they mean.
No network: references resolve only within the schema and to the bundled draft
meta-schemas (an empty `referencing.Registry`, so a remote `$ref` is an error, never a
download). A case that cannot be read, or a schema that is missing or not a schema,
exits with status 1 and a message on stderr.
"""
import json
import os
import sys

import jsonschema
import referencing

SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas")
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def fail(message):
    print(f"validate.py: {message}", file=sys.stderr)
    sys.exit(1)


def load(name):
    if not name or "/" in name or name.startswith("."):
        fail(f"{name!r} is not a schema name")
    path = os.path.join(SCHEMAS, f"{name}.json")
    try:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e} (WEIR_BLESS=1 writes it)")
    if schema.get("$schema") != DRAFT:
        fail(f"{name}: $schema is {schema.get('$schema')!r}, not {DRAFT}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        fail(f"{name}: not a schema: {e.message}")
    return jsonschema.Draft202012Validator(schema, registry=referencing.Registry())


def violations(validator, instance):
    errors = list(validator.iter_errors(instance))
    if not errors:
        return []
    best = jsonschema.exceptions.best_match(errors)
    errors.sort(key=lambda e: e is not best)
    return [f"{e.message} at /{'/'.join(str(p) for p in e.absolute_path)}" for e in errors]


def main():
    validators = {}
    for n, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
            name, label, instance = case["schema"], case["label"], case["instance"]
        except (ValueError, KeyError, TypeError) as e:
            fail(f"line {n}: not a case: {e}")
        if name not in validators:
            validators[name] = load(name)
        errors = violations(validators[name], instance)
        print(json.dumps({"schema": name, "label": label, "errors": errors}))


if __name__ == "__main__":
    main()
