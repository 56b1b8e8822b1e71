#!/usr/bin/env python3
"""check_logs.py FORMAT SERVICE=FILE... - every line of each service log is a log line of FORMAT.

text: "2026-11-30T08:49:50.123Z INFO  SERVICE message", or a "FATAL message" line.
json: one JSON object per line with time (ISO-8601 UTC, milliseconds), level, service (= SERVICE),
      id and message strings; job, tenant strings and fields (an object of strings) when present.
Prints one line per problem (at most 10 per file) and a summary; exits 1 on any problem.
Also prints, for the json format, how many lines carried job, tenant and fields, per file.
"""
import json
import re
import sys

TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
LEVELS = {"debug", "info", "warn", "error", "fatal"}


def check_text(service, line):
    if line.startswith("FATAL "):
        return None
    if not re.fullmatch(TIME + r" (DEBUG|INFO |WARN |ERROR) " + re.escape(service) + r" .*", line):
        return "not a text log line of " + service
    return None


def check_json(service, line, seen):
    try:
        o = json.loads(line)
    except ValueError as e:
        return f"not JSON ({e})"
    if not isinstance(o, dict):
        return "not a JSON object"
    for k in ("time", "level", "service", "id", "message"):
        if not isinstance(o.get(k), str):
            return f"no string {k}"
    if not re.fullmatch(TIME, o["time"]):
        return f"time {o['time']!r} is not ISO-8601 UTC with milliseconds"
    if o["level"] not in LEVELS:
        return f"level {o['level']!r}"
    if o["service"] != service:
        return f"service {o['service']!r}, expected {service!r}"
    for k in ("job", "tenant"):
        if k in o:
            if not isinstance(o[k], str) or not o[k]:
                return f"{k} is not a non-empty string"
            seen[k] += 1
    if "fields" in o:
        f = o["fields"]
        if not isinstance(f, dict) or not f or not all(isinstance(v, str) for v in f.values()):
            return "fields is not an object of strings"
        seen["fields"] += 1
    extra = set(o) - {"time", "level", "service", "id", "job", "tenant", "message", "fields"}
    if extra:
        return f"unexpected keys {sorted(extra)}"
    return None


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("text", "json"):
        print(__doc__)
        return 2
    fmt, bad, total = sys.argv[1], 0, 0
    for arg in sys.argv[2:]:
        service, path = arg.split("=", 1)
        seen = {"job": 0, "tenant": 0, "fields": 0}
        shown = 0
        with open(path, "rb") as f:
            raw = f.read()
        if raw and not raw.endswith(b"\n"):
            print(f"{path}: the last line has no newline")
            bad += 1
        lines = raw.decode("utf-8", errors="replace").splitlines()
        if not lines:
            print(f"{path}: empty")
            bad += 1
        for i, line in enumerate(lines, 1):
            why = check_text(service, line) if fmt == "text" else check_json(service, line, seen)
            if why:
                bad += 1
                if shown < 10:
                    print(f"{path}:{i}: {why}: {line[:200]}")
                shown += 1
        total += len(lines)
        if fmt == "json":
            print(f"{path}: {len(lines)} lines, with job {seen['job']}, tenant {seen['tenant']}, fields {seen['fields']}")
    print(f"{total} lines of {len(sys.argv) - 2} logs checked as {fmt}: {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
