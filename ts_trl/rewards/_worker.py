"""The sandbox's worker: a fresh interpreter (`python -I -S -B -c <this file>`) that runs the untrusted program.

It imports built-in modules only, so that its start costs about one bare interpreter. The judge (`_harness.py`) loads
this file too, for `encode`/`decode` and the framing: one definition of what crosses the boundary. Requests (the
judge's, trusted) come as marshal data; replies go back as JSON, which the judge parses with its own strict decoder.
"""

import builtins
import marshal
import os
import sys
from _json import encode_basestring_ascii

REQUESTS, REPLIES = 3, 4  # the worker's two pipes, at fixed numbers: it holds no other descriptor
MAX_FRAME = 16 << 20  # bytes per call or reply: a program cannot make the judge hold more
MAX_DEPTH = 100


def encode(value, depth=0):
    """JSON-ready form of plain data; anything else (subclasses included) raises TypeError naming its type."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply to cross the sandbox boundary")
    if kind is int and value.bit_length() > 64:
        return {"int": format(value, "x")}  # hex: no 4,300-digit limit on the way (7**6000 is a fine answer)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(item, depth + 1) for item in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode(key, depth + 1), encode(item, depth + 1)] for key, item in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise TypeError(f"a {kind.__name__} cannot cross the sandbox boundary: only plain data (None, bool, int, float, "
                    "str, bytes, list, tuple, set, frozenset, dict) is passed between the tests and the program")  # fmt: skip


def decode(value, depth=0):
    """The inverse of `encode`, building only fresh built-in objects; raises ValueError on anything malformed."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [decode(item, depth + 1) for item in value]
    if kind is not dict or len(value) != 1:
        raise ValueError("malformed value from the program's process")
    (tag, body), build = next(iter(value.items())), {"tuple": tuple, "set": set, "frozenset": frozenset}
    if tag in build and type(body) is list:
        return build[tag](decode(item, depth + 1) for item in body)
    if tag == "dict" and type(body) is list and all(type(pair) is list and len(pair) == 2 for pair in body):
        return {decode(key, depth + 1): decode(item, depth + 1) for key, item in body}
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "int" and type(body) is str and len(body) <= MAX_FRAME:
        return int(body, 16)  # a power-of-two base: not under the int-str digit limit
    raise ValueError("malformed value from the program's process")


def to_json(value):
    """JSON text of `encode`'s output (or of any None/bool/int/float/str, list, str-keyed dict), without the json
    package, whose import would double the worker's start-up; NaN and infinities as Python's json writes them."""
    kind = type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        if value != value:
            return "NaN"
        return float.__repr__(value) if abs(value) != float("inf") else ("Infinity" if value > 0 else "-Infinity")
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is list:
        return "[" + ",".join([to_json(item) for item in value]) + "]"
    if kind is dict:
        return (
            "{" + ",".join([encode_basestring_ascii(key) + ":" + to_json(item) for key, item in value.items()]) + "}"
        )
    raise TypeError(f"cannot write a {kind.__name__} as JSON")


def send_frame(fd, data):
    data = len(data).to_bytes(4, "little") + data
    while data:
        data = data[os.write(fd, data) :]


def read_frame(fd, limit=MAX_FRAME):
    """One length-prefixed message, or None at end of file; the length is checked before anything is read."""
    header = _read_exactly(fd, 4)
    if header is None:
        return None
    size = int.from_bytes(header, "little")
    if size > limit:
        raise ValueError(f"the program sent {size} bytes in one reply (limit {limit})")
    return _read_exactly(fd, size)


def _read_exactly(fd, size):
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _fail():
    sys.stdout.flush()  # what it printed before failing, for the logs
    sys.__excepthook__(*sys.exc_info())
    os._exit(1)


def run(program, tests_mode):
    """Runs the program; in tests mode, then tells the judge its top-level names and answers calls until EOF."""
    namespace = {"__name__": "__candidate__" if tests_mode else "__main__"}
    try:
        exec(compile(program, "program.py", "exec"), namespace)
    except SystemExit as stop:
        if tests_mode or stop.code not in (None, 0):
            _fail()
    except BaseException:
        _fail()
    if not tests_mode:  # stdin/stdout mode: the caller compares what the program printed
        sys.stdout.flush()
        os._exit(0)
    exported = {}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if type(value) is type(os):
            exported[name] = ["module", value.__name__]
        elif callable(value):
            exported[name] = ["callable", None]
        else:
            try:
                exported[name] = ["value", encode(value)]
            except (TypeError, ValueError, RecursionError):
                exported[name] = ["other", type(value).__name__]
    send_frame(REPLIES, to_json(exported).encode())
    while (frame := read_frame(REQUESTS)) is not None:
        try:
            request = marshal.loads(frame)
            args, kwargs = decode(request["args"]), decode(request["kwargs"])
            reply = to_json({"value": encode(namespace[request["name"]](*args, **kwargs))})
        except BaseException as error:  # SystemExit too: the judge decides what an exception in a test means
            reply = to_json({"error": [type(error).__name__, _message(error)]})
        sys.stdout.flush()
        send_frame(REPLIES, reply.encode())
    os._exit(0)


def _message(error):
    """The start of an exception's text; one whose `str` fails (an int over 4,300 digits in it) gives its type."""
    try:
        return str(error)[:1000]
    except Exception:
        return f"<{type(error).__name__} whose message cannot be shown>"


def _quit(code=None):
    raise SystemExit(code)


def main():
    """Reads the program, its mode and the runtime's site-packages from the keeper, then runs it."""
    init = marshal.loads(read_frame(REQUESTS))
    sys.path.extend(init["site_packages"])  # started with -S: site-packages without their .pth hooks
    builtins.exit = builtins.quit = _quit  # as site would define them
    sys.argv = ["program.py"]
    if not init["tests_mode"]:
        os.close(REQUESTS)
        os.close(REPLIES)
    run(init["program"], init["tests_mode"])


if __name__ == "__main__":
    main()
