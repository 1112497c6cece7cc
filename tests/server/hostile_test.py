#!/usr/bin/env python3
"""Malformed and hostile requests against `kestrel serve`: each must get its error (an OpenAI error object with a 4xx,
or a closed connection where HTTP itself is broken), and the server must stay healthy afterwards. Raw sockets and
http.client, so nothing on the client side repairs the request."""

import json
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_fixture import MODEL_NAME, Server, check_clean_exit  # noqa: E402

MAX_BODY = 65536
HELLO = [{"role": "user", "content": "hi"}]


def chat(**extra):
    body = {"model": MODEL_NAME, "messages": HELLO, "max_tokens": 2}
    body.update(extra)
    return json.dumps(body).encode()


# (name, path, raw body bytes, expected status, expected param or None)
BODY_CASES = [
    ("bad json", "/v1/chat/completions", b"{bad", 400, None),
    ("empty body", "/v1/chat/completions", b"", 400, None),
    ("json null", "/v1/chat/completions", b"null", 400, None),
    ("json array", "/v1/chat/completions", b"[]", 400, None),
    ("json number", "/v1/chat/completions", b"123", 400, None),
    ("json string", "/v1/chat/completions", b'"hello"', 400, None),
    ("trailing garbage", "/v1/chat/completions", chat() + b" trailing", 400, None),
    ("nan literal", "/v1/chat/completions", b'{"messages": [], "temperature": NaN}', 400, None),
    ("deep nesting", "/v1/chat/completions", b"[" * 30000 + b"]" * 30000, 400, None),
    ("deep nesting in field", "/v1/chat/completions", b'{"messages": ' + b"[" * 3000 + b"]" * 3000 + b"}", 400, None),
    ("invalid utf-8", "/v1/chat/completions",
     b'{"model": "tiny-glm", "messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}', 400, None),
    ("lone surrogate", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, None),
    ("messages missing", "/v1/chat/completions", b'{"model": "tiny-glm"}', 400, "messages"),
    ("messages string", "/v1/chat/completions", b'{"messages": "hi"}', 400, "messages"),
    ("messages empty", "/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    ("message not object", "/v1/chat/completions", b'{"messages": [1]}', 400, "messages"),
    ("role wrong type", "/v1/chat/completions", b'{"messages": [{"role": 5, "content": "x"}]}', 400, "messages"),
    ("role unknown", "/v1/chat/completions", b'{"messages": [{"role": "root", "content": "x"}]}', 400, "messages"),
    ("content number", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages"),
    ("model wrong type", "/v1/chat/completions", chat(model=["x"]), 400, "model"),
    ("unknown model", "/v1/chat/completions", chat(model="gpt-4"), 404, "model"),
    ("temperature string", "/v1/chat/completions", chat(temperature="hot"), 400, "temperature"),
    ("temperature negative", "/v1/chat/completions", chat(temperature=-0.5), 400, "temperature"),
    ("top_p too big", "/v1/chat/completions", chat(top_p=5), 400, "top_p"),
    ("top_k too small", "/v1/chat/completions", chat(top_k=-7), 400, "top_k"),
    ("min_p too big", "/v1/chat/completions", chat(min_p=2), 400, "min_p"),
    ("n zero", "/v1/chat/completions", chat(n=0), 400, "n"),
    ("n string", "/v1/chat/completions", chat(n="2"), 400, "n"),
    ("n huge", "/v1/chat/completions", chat(n=100000), 400, "n"),
    ("max_tokens negative", "/v1/chat/completions", chat(max_tokens=-1), 400, "max_tokens"),
    ("max_tokens huge", "/v1/chat/completions", chat(max_tokens=10**12), 400, "max_completion_tokens"),
    ("max_tokens beyond int64", "/v1/chat/completions", chat(max_tokens=2**70), 400, "max_tokens"),
    ("max_tokens float", "/v1/chat/completions", chat(max_tokens=2.5), 400, "max_tokens"),
    ("max_completion_tokens huge", "/v1/chat/completions", chat(max_completion_tokens=10**9), 400,
     "max_completion_tokens"),
    ("min_tokens above max", "/v1/chat/completions", chat(min_tokens=5, max_tokens=2), 400, "min_tokens"),
    ("stop number", "/v1/chat/completions", chat(stop=5), 400, "stop"),
    ("stop empty string", "/v1/chat/completions", chat(stop=[""]), 400, "stop"),
    ("stream string", "/v1/chat/completions", chat(stream="yes"), 400, "stream"),
    ("stream_options without stream", "/v1/chat/completions", chat(stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("logprobs string", "/v1/chat/completions", chat(logprobs="x"), 400, "logprobs"),
    ("top_logprobs too many", "/v1/chat/completions", chat(logprobs=True, top_logprobs=100), 400, "top_logprobs"),
    ("logit_bias list", "/v1/chat/completions", chat(logit_bias=[1, 2]), 400, "logit_bias"),
    ("logit_bias bad key", "/v1/chat/completions", chat(logit_bias={"abc": 1}), 400, "logit_bias"),
    ("logit_bias out of vocab", "/v1/chat/completions", chat(logit_bias={"1000000": 1}), 400, None),
    ("stop_token_ids out of vocab", "/v1/chat/completions", chat(stop_token_ids=[10**6]), 400, None),
    ("seed string", "/v1/chat/completions", chat(seed="x"), 400, "seed"),
    ("presence_penalty too big", "/v1/chat/completions", chat(presence_penalty=9), 400, "presence_penalty"),
    ("repetition_penalty zero", "/v1/chat/completions", chat(repetition_penalty=0), 400, "repetition_penalty"),
    ("tools string", "/v1/chat/completions", chat(tools="x"), 400, "tools"),
    ("tool without name", "/v1/chat/completions", chat(tools=[{"type": "function", "function": {}}]), 400, "tools"),
    ("tool_choice number", "/v1/chat/completions", chat(tool_choice=42), 400, "tool_choice"),
    ("tool_choice without tools", "/v1/chat/completions", chat(tool_choice="required"), 400, "tool_choice"),
    ("response_format schema", "/v1/chat/completions", chat(response_format={"type": "json_schema"}), 400,
     "response_format"),
    ("chat_template_kwargs string", "/v1/chat/completions", chat(chat_template_kwargs="x"), 400,
     "chat_template_kwargs"),
    ("prompt too long", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "word " * 2000}]}).encode(), 400, "messages"),
    ("completion prompt missing", "/v1/completions", b'{"max_tokens": 2}', 400, "prompt"),
    ("completion prompt empty list", "/v1/completions", b'{"prompt": []}', 400, "prompt"),
    ("completion prompt negative id", "/v1/completions", b'{"prompt": [-1]}', 400, "prompt"),
    ("completion prompt id out of vocab", "/v1/completions", b'{"prompt": [999999]}', 400, "prompt"),
    ("completion prompt mixed", "/v1/completions", b'{"prompt": [1, "a"]}', 400, "prompt"),
    ("completion prompt empty string", "/v1/completions", b'{"prompt": ""}', 400, "prompt"),
    ("completion suffix", "/v1/completions", b'{"prompt": "a", "suffix": "b"}', 400, "suffix"),
    ("completion echo with logprobs", "/v1/completions", b'{"prompt": "a", "echo": true, "logprobs": 1}', 400, "echo"),
    ("completion logprobs too many", "/v1/completions", b'{"prompt": "a", "logprobs": 99}', 400, "logprobs"),
    ("completion best_of", "/v1/completions", b'{"prompt": "a", "best_of": 4}', 400, "best_of"),
    ("completion too long", "/v1/completions", json.dumps({"prompt": "word " * 2000}).encode(), 400, "prompt"),
    ("tokenize empty object", "/tokenize", b"{}", 400, "prompt"),
    ("tokenize bad json", "/tokenize", b"{", 400, None),
    ("detokenize negative", "/detokenize", b'{"tokens": [-5]}', 400, "tokens"),
    ("detokenize not list", "/detokenize", b'{"tokens": "x"}', 400, "tokens"),
]


def read_response(sock, timeout=30, leftover=None):
    """Reads one response (or until close) -> (status or None, body bytes). With `leftover` (a list holding one
    bytes object), bytes past this response are kept there for the next call (pipelining)."""
    sock.settimeout(timeout)
    data = leftover[0] if leftover else b""
    try:
        while b"\r\n\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                break
            data += part
        if b"\r\n\r\n" not in data:
            return None, data
        head, body = data.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ")[1])
        length = None
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        while length is not None and len(body) < length:
            part = sock.recv(65536)
            if not part:
                break
            body += part
        if leftover is not None and length is not None:
            body, leftover[0] = body[:length], body[length:]
        return status, body
    except (socket.timeout, ConnectionResetError):
        return None, data


class Hostile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--request-read-timeout", "1", "--max-request-bytes", str(MAX_BODY))

    @classmethod
    def tearDownClass(cls):
        check_clean_exit(checker, cls.server)

    def tearDown(self):
        self.assertTrue(self.server.healthy(), "server unhealthy after " + self.id())

    def raw(self, data, timeout=30, shutdown=False):
        sock = socket.create_connection(("127.0.0.1", self.server.port))
        try:
            sock.sendall(data)
            if shutdown:
                sock.shutdown(socket.SHUT_WR)
            return read_response(sock, timeout)
        finally:
            sock.close()

    def assert_error(self, status, body, expected_status, param=None, name=""):
        self.assertEqual(status, expected_status, f"{name}: {body[:300]!r}")
        err = json.loads(body)["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"}, name)
        self.assertTrue(err["message"], name)
        if param is not None:
            self.assertEqual(err["param"], param, f"{name}: {err}")

    def test_bad_bodies(self):
        for name, path, body, status, param in BODY_CASES:
            with self.subTest(name):
                got, headers, data = self.server.request("POST", path, body,
                                                         {"Content-Type": "application/json"})
                self.assert_error(got, data, status, param, name)
        self.assertGreaterEqual(len(BODY_CASES), 60)

    def test_oversize_body_content_length(self):
        body = b'{"messages": [{"role": "user", "content": "' + b"a" * (MAX_BODY + 10) + b'"}]}'
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        status, data = self.raw(head + body)
        self.assert_error(status, data, 413)

    def test_oversize_body_chunked(self):
        chunk = b"a" * 16384
        data = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        data += (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 6 + b"0\r\n\r\n"
        status, body = self.raw(data)
        self.assert_error(status, body, 413)

    def test_valid_chunked_body(self):
        body = chat()
        data = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        data += b"%x\r\n" % 5 + body[:5] + b"\r\n" + b"%x\r\n" % (len(body) - 5) + body[5:] + b"\r\n0\r\n\r\n"
        status, _ = self.raw(data)
        self.assertEqual(status, 200)

    def test_header_too_large(self):
        status, body = self.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        self.assert_error(status, body, 431)

    def test_long_url(self):
        status, _ = self.raw(b"GET /" + b"a" * 30000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(status, (400, 414, 431))

    def test_garbage_request_lines(self):
        for name, data in [("garbage", b"GARBAGE\r\n\r\n"),
                           ("bad version", b"GET /health FOO/1.1\r\n\r\n"),
                           ("binary", bytes(range(256)) * 4),
                           ("bad content-length", b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n"),
                           ("two content-lengths",
                            b"POST /tokenize HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
                           ("bad chunk size", b"POST /tokenize HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
                           ("header without colon", b"GET /health HTTP/1.1\r\nBadHeader\r\n\r\n"),
                           ("nul in header", b"GET /health HTTP/1.1\r\nX: a\x00b\r\n\r\n")]:
            with self.subTest(name):
                status, body = self.raw(data)
                self.assert_error(status, body, 400, name=name)

    def test_routes_and_methods(self):
        for method, path, status in [("GET", "/nope", 404), ("GET", "/v1/chat/completions", 405),
                                     ("PUT", "/v1/models", 405), ("DELETE", "/health", 405),
                                     ("POST", "/metrics", 405), ("GET", "/v1/completions/../models", 404),
                                     ("PATCH", "/v1/completions", 405), ("GET", "/v2/models", 404)]:
            with self.subTest(f"{method} {path}"):
                got, _, body = self.server.request(method, path)
                self.assert_error(got, body, status)

    def test_slow_client_headers(self):
        sock = socket.create_connection(("127.0.0.1", self.server.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        start = time.time()
        status, body = read_response(sock, timeout=20)
        sock.close()
        self.assert_error(status, body, 408)
        self.assertLess(time.time() - start, 10)

    def test_slow_client_body(self):
        sock = socket.create_connection(("127.0.0.1", self.server.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
        status, body = read_response(sock, timeout=20)
        sock.close()
        self.assert_error(status, body, 408)

    def test_idle_connections_are_closed(self):
        socks = [socket.create_connection(("127.0.0.1", self.server.port)) for _ in range(40)]
        self.assertTrue(self.server.healthy())  # idle sockets do not block others
        for s in socks:
            s.settimeout(10)
            self.assertEqual(s.recv(100), b"")  # closed by the server after the read deadline, no response
            s.close()

    def test_keep_alive_and_pipelining(self):
        sock = socket.create_connection(("127.0.0.1", self.server.port))
        one = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        body = chat()
        two = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
        sock.sendall(one + two + one)
        leftover = [b""]
        statuses = [read_response(sock, leftover=leftover)[0] for _ in range(3)]
        sock.close()
        self.assertEqual(statuses, [200, 200, 200])

    def test_http10_without_host(self):
        status, _ = self.raw(b"GET /health HTTP/1.0\r\n\r\n")
        self.assertEqual(status, 200)

    def metric(self, name):
        _, _, body = self.server.request("GET", "/metrics")
        for line in body.decode().splitlines():
            if line.startswith(name):
                return float(line.split()[-1])
        self.fail(f"{name} missing")

    def wait_idle(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.metric("vllm:num_requests_running") == 0 and self.metric("vllm:num_requests_waiting") == 0:
                return
            time.sleep(0.02)
        self.fail("requests still running after the client left")

    def test_disconnect_mid_stream_cancels(self):
        aborted = self.metric('vllm:request_success_total{model_name="tiny-glm",finished_reason="abort"}')
        body = json.dumps({"prompt": "go on", "max_tokens": 400, "stream": True, "ignore_eos": True}).encode()
        sock = socket.create_connection(("127.0.0.1", self.server.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        sock.settimeout(30)
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        sock.close()
        self.wait_idle()
        self.assertEqual(self.metric('vllm:request_success_total{model_name="tiny-glm",finished_reason="abort"}'),
                         aborted + 1)

    def test_disconnect_while_waiting_non_streaming(self):
        aborted = self.metric('vllm:request_success_total{model_name="tiny-glm",finished_reason="abort"}')
        body = json.dumps({"prompt": "go on", "max_tokens": 400, "ignore_eos": True}).encode()
        sock = socket.create_connection(("127.0.0.1", self.server.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.time() + 30
        while self.metric("vllm:num_requests_running") == 0 and time.time() < deadline:
            time.sleep(0.005)
        sock.close()
        self.wait_idle()
        self.assertEqual(self.metric('vllm:request_success_total{model_name="tiny-glm",finished_reason="abort"}'),
                         aborted + 1)

    def test_half_sent_then_reset(self):
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", self.server.port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 500\r\n\r\n{\"mess")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()  # RST


checker = unittest.TestCase()

if __name__ == "__main__":
    unittest.main(verbosity=2)
