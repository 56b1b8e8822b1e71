#!/usr/bin/env python3
"""sample.py - the end-to-end benchmark's timeline sampler (bench/e2e.sh): once a second, the
rollout's and the trainer's newest heartbeat counters from Redis and their CPU-seconds from /proc,
one CSV line each time, until stopped (SIGTERM).

    bench/sample.py OUT.csv REDIS_PORT ROLLOUT_PID TRAINER_PID T0

REDISCLI_AUTH holds the Redis password (as for redis-cli); T0 is the run's start (seconds since
the epoch, $EPOCHREALTIME). One process with one Redis connection: a sampler that starts a dozen
processes a second (redis-cli, awk) took a tenth of a 2-core machine away from the run it measured.
"""
import os
import signal
import socket
import sys
import time


class Redis:
    """The few RESP commands the sampler needs, on one connection."""

    def __init__(self, port, password):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.f = self.s.makefile("rb")
        if password:
            self.cmd("AUTH", password)

    def cmd(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.s.sendall(b"".join(out))
        return self.reply()

    def reply(self):
        line = self.f.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            return data.decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError("unexpected reply %r" % line)


def main():
    out, port, roll_pid, train_pid, t0 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
    hz = os.sysconf("SC_CLK_TCK")
    r = Redis(port, os.environ.get("REDISCLI_AUTH", ""))
    keys = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

    def key(name):
        if name not in keys:
            cursor, found = "0", None
            while found is None:
                cursor, batch = r.cmd("SCAN", cursor, "MATCH", "*svc:%s:*" % name, "COUNT", 1000)
                found = batch[0] if batch else None
                if cursor == "0":
                    break
            if found is None:
                return None
            keys[name] = found
        return keys[name]

    def beat(name, counter):
        k = key(name)
        if k is None:
            return ",,"
        v = r.cmd("HMGET", k, "busy_s", "up_s", counter)
        if all(x is None for x in v):
            keys.pop(name, None)   # a restarted service beats under a new key
        return ",".join("" if x is None else x for x in v)

    def cpu(pid):
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return "%.2f" % ((int(fields[11]) + int(fields[12])) / hz)
        except (OSError, IndexError, ValueError):
            return ""

    with open(out, "w") as f:
        f.write("t,roll_busy_s,roll_up_s,tokens,roll_cpu_s,train_busy_s,train_up_s,steps,train_cpu_s\n")
        while not stop:
            t = time.time() - t0
            try:
                row = "%.2f,%s,%s,%s,%s" % (t, beat("rollout", "tokens"), cpu(roll_pid), beat("trainer", "steps"),
                                           cpu(train_pid))
            except (OSError, ConnectionError, RuntimeError):
                try:
                    r = Redis(port, os.environ.get("REDISCLI_AUTH", ""))
                except OSError:
                    pass
                row = None
            if row:
                f.write(row + "\n")
                f.flush()
            time.sleep(1)


if __name__ == "__main__":
    main()
