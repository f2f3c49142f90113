"""A local server speaking OpenAI's Chat Completions (non-streaming), for
tests with no network: it records every request and answers from a
function of the request; `hang` holds the answers back (a provider that
stops mid-summary)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    def __init__(self, answer=None):
        self.requests = []
        self.hang = threading.Event()
        self.answer = answer or (lambda body: f"summary of {len(body['messages'])} messages")
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(n))
                fake.requests.append(
                    {"path": self.path, "auth": self.headers.get("authorization"), "body": body}
                )
                while fake.hang.is_set():
                    fake.hang.wait(0.05)
                    if not fake.hang.is_set():
                        break
                    threading.Event().wait(0.05)
                text = fake.answer(body)
                if body.get("stream"):
                    # Server-sent events: the text in three pieces, then the
                    # usage in a chunk of its own, then [DONE].
                    third = max(1, len(text) // 3)
                    pieces = [text[i : i + third] for i in range(0, len(text), third)]
                    chunks = [
                        {"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
                        for p in pieces
                    ]
                    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                    chunks.append(
                        {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7}}
                    )
                    data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
                    data += "data: [DONE]\n\n"
                    out = data.encode()
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("content-length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                    return
                out = json.dumps(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.hang.clear()
        self.server.shutdown()
