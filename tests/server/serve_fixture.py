"""Starts `kestrel serve` on the fixture model for the server suites and stops it with SIGTERM.

The binary and the model come from the environment ctest sets (KESTREL_BINARY, KESTREL_SERVE_MODEL); run by hand:
    KESTREL_BINARY=build/kestrel KESTREL_SERVE_MODEL=tests/data/serve_model python3 tests/server/e2e_test.py
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("KESTREL_BINARY", os.path.join(ROOT, "build", "kestrel"))
MODEL = os.environ.get("KESTREL_SERVE_MODEL", os.path.join(ROOT, "tests", "data", "serve_model"))
MODEL_NAME = "tiny-glm"
API_KEY = "sk-test-kestrel"


class Server:
    """A running `kestrel serve --port 0`; the port is read from its ready line."""

    def __init__(self, *extra, api_key=None, env=None, model=MODEL, name=MODEL_NAME):
        defaults = {"--max-model-len": "512", "--max-num-seqs": "16"}  # `extra` may override these
        args = [BINARY, "serve", "--model", model, "--served-model-name", name, "--host", "127.0.0.1",
                "--port", "0", "--tool-call-parser", "glm47", "--reasoning-parser", "glm45",
                "--enable-auto-tool-choice", *extra]
        for flag, value in defaults.items():
            if flag not in extra:
                args += [flag, value]
        if api_key:
            args += ["--api-key", api_key]
        full_env = dict(os.environ)
        full_env.pop("KESTREL_API_KEY", None)
        full_env.pop("VLLM_API_KEY", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
        self.stderr_lines = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.time() + 120
        self.port = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"ready on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("kestrel serve did not start:\n" + "".join(self.stderr_lines))
        self.base_url = f"http://127.0.0.1:{self.port}"

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """-> (status, headers dict, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def healthy(self):
        status, _, _ = self.request("GET", "/health", timeout=10)
        return status == 200

    def stop(self, timeout=60):
        """SIGTERM, then the exit status (a server that does not drain and exit in time is killed: -9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        self.proc.stdout.close()
        return self.proc.returncode

    def log(self):
        return "".join(self.stderr_lines)


def check_clean_exit(test, server):
    code = server.stop()
    log = server.log()
    test.assertEqual(code, 0, f"server exit status {code}\n{log[-4000:]}")
    test.assertNotIn("ERROR: AddressSanitizer", log)
    test.assertNotIn("runtime error:", log)  # UBSan


def die(message):
    print(message, file=sys.stderr)
    sys.exit(1)
