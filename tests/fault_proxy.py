"""A tiny HTTP proxy in front of one store daemon, for fault-injection tests: it
forwards every request to the daemon and, when a request matches an armed rule, does
something to the daemon or the connection at exactly that moment:

  kill-before   SIGKILL the daemon, then drop the connection (the request never ran)
  drop-reply    forward the request, then drop the connection (the reply is lost)
  stop-before   SIGSTOP the daemon, then forward the request and wait for the reply
                (which does not come while the daemon is stopped)
  a callable    call it (the request waits meanwhile), then forward the request

A daemon that cannot be reached (dead) also drops the connection, as the real one
would. The target can be changed (a restarted daemon listens on another port).
"""

import http.client
import http.server
import os
import re
import signal
import socketserver
import threading
import urllib.parse


class FaultProxy:
    def __init__(self):
        self.target = None  # "http://127.0.0.1:PORT"
        self.pid = None  # the daemon's process id
        self.rules = []  # [(method, regex, action, remaining count)]
        self.hits = []  # (method, path, action) of every rule that fired
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                action = proxy.match(self.command, self.path)
                if callable(action):  # a hook: runs while the request waits, then it goes on
                    action()
                if action == "kill-before":
                    os.kill(proxy.pid, signal.SIGKILL)
                    self.close_connection = True
                    return
                if action == "stop-before":
                    os.kill(proxy.pid, signal.SIGSTOP)
                u = urllib.parse.urlparse(proxy.target)
                try:
                    c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
                    headers = {
                        k: v
                        for k, v in self.headers.items()
                        if k.lower() not in ("host", "connection", "content-length")
                    }
                    c.request(self.command, self.path, body=body, headers=headers)
                    r = c.getresponse()
                    data = r.read()
                    c.close()
                except OSError:
                    self.close_connection = True
                    return
                if action == "drop-reply":
                    self.close_connection = True
                    return
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:  # the client gave up (timed out) meanwhile
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = handle_any

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def point_at(self, daemon):
        self.target, self.pid = daemon.url, daemon.proc.pid

    def arm(self, method, pattern, action, count=1):
        with self.lock:
            self.rules.append([method, re.compile(pattern), action, count])

    def match(self, method, path):
        with self.lock:
            for rule in self.rules:
                if rule[0] == method and rule[1].search(path) and rule[3] > 0:
                    rule[3] -= 1
                    self.hits.append((method, path, rule[2]))
                    return rule[2]
        return None

    def close(self):
        self.server.shutdown()
