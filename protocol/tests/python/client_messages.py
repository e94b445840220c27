#!/usr/bin/env python3
"""What the Python client (`weir.llm` of the installed `weir` package) sends and how it
reads refusals, for protocol/tests/it/schemas.rs (run in the Python where
scripts/build-python-wheel installed the package; weir.llm imports nats lazily).

    python3 client_messages.py headers   # one JSON object per line: request headers
    python3 client_messages.py refusals  # stdin: JSON list of {"headers", "body"} error
                                         # replies; prints what LlmError holds for each
"""
import json
import sys

from weir import llm as weir_llm

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

CALLS = [
    {},
    {"request_id": "call-42:turn-7"},
    {"request_id": "r-1", "session_id": "s-1", "timeout_ms": 2000, "client_key": "tenant-a",
     "admission": "reject"},
    {"session_id": "s-1", "admission": "enqueue", "timeout_ms": 0},
    {"traceparent": TRACEPARENT, "tracestate": "vendor=a1,other=b"},
    {"traceparent": TRACEPARENT, "request_id": "x" * 256},
]


def headers():
    for call in CALLS:
        unary = weir_llm.CallOptions(**call).headers()
        print(json.dumps({"kind": "request", "headers": unary}))
        # stream() adds Weir-Stream: 1 to the same headers.
        streamed = dict(unary)
        streamed[weir_llm.STREAM] = "1"
        print(json.dumps({"kind": "stream", "headers": streamed}))
        # The durable intake adds the dedup id and the reply subject.
        durable = dict(unary)
        durable.setdefault(weir_llm.REQUEST_ID, "inbox-id")
        durable[weir_llm.NATS_MSG_ID] = durable[weir_llm.REQUEST_ID]
        durable[weir_llm.REPLY_TO] = "_INBOX.caller.abc"
        print(json.dumps({"kind": "durable", "headers": durable}))


class Msg:
    def __init__(self, headers, data):
        self.headers = headers
        self.data = data


def refusals():
    for reply in json.load(sys.stdin):
        msg = Msg(reply["headers"], reply["body"].encode("utf-8"))
        try:
            weir_llm._check_error(msg)
        except weir_llm.LlmError as e:
            print(json.dumps({"code": e.code, "message": e.message, "details": e.details,
                              "nats_code": e.nats_code, "envelope": e.envelope}))
        else:
            print(json.dumps({"not_an_error": True}))


if __name__ == "__main__":
    {"headers": headers, "refusals": refusals}[sys.argv[1]]()
