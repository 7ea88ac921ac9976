#!/usr/bin/env python3
"""e8kv generate --save-cache / --load-cache on stories260K (llama2.c checkpoint in the repository's data/):
greedy generation continued from a saved cache must print exactly what a run without save/load prints,
for several cache formats (window, sink, per-layer formats); a different prompt, a different --kv, a
corrupted file and a missing file must be refused with a non-zero exit. Skips (77) without the CLI or the
model."""
import os
import subprocess
import sys
import tempfile

CLI = os.environ.get("E8KV_CLI")
DATA = os.environ.get("E8KV_SHARED_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
MODEL = os.path.join(DATA, "stories260K", "stories260K.bin")
PROMPT = "Once upon a time, there was a little girl"
N_GEN = "48"


def run(*args, ok=True):
    p = subprocess.run([CLI, "generate", "-m", MODEL, "--temp", "0", "--threads", "1", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)}: exit {p.returncode}\n{p.stderr.decode()}")
    return p


def main():
    if not CLI or not os.path.exists(CLI) or not os.path.exists(MODEL):
        print("skip: needs E8KV_CLI and stories260K")
        return 77
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.e8kc")
        for kv in ["f32", "e8:4", "k=e8:4,v=e8:3,window=4,sink=2,page=4", "e8:2,layers1-2=f16"]:
            plain = run("-p", PROMPT, "-n", N_GEN, "--kv", kv, "--ctx", "128").stdout
            saved = run("-p", PROMPT, "-n", N_GEN, "--kv", kv, "--ctx", "128", "--save-cache", path).stdout
            loaded = run("-p", PROMPT, "-n", N_GEN, "--kv", kv, "--ctx", "128", "--load-cache", path).stdout
            # without -p and --kv: the prompt and the spec come from the file
            bare = run("-n", N_GEN, "--ctx", "128", "--load-cache", path).stdout
            before = failures
            for name, out in [("save", saved), ("load", loaded)]:
                if out != plain:
                    print(f"FAIL --kv {kv}: {name} run differs\n  plain: {plain!r}\n  {name}: {out!r}")
                    failures += 1
            gen = plain.decode()[len(PROMPT):]
            if not bare.decode().endswith(gen) or len(gen.strip()) == 0:
                print(f"FAIL --kv {kv}: bare load run differs\n  plain: {plain!r}\n  bare: {bare!r}")
                failures += 1
            if failures == before:
                print(f"ok --kv {kv}: {len(plain)} bytes of identical output, cache file {os.path.getsize(path)} bytes")
        # refusals (the file holds the last format above)
        for args in (["-p", "Once upon a time, there was a boy"],       # another prompt
                     ["-p", PROMPT, "--kv", "e8:3"]):                    # another format
            p = run(*args, "-n", "4", "--ctx", "128", "--load-cache", path, ok=False)
            if p.returncode == 0:
                print(f"FAIL: {args} with --load-cache was accepted")
                failures += 1
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x10
        bad = os.path.join(tmp, "bad.e8kc")
        open(bad, "wb").write(bytes(data))
        for f, what in [(bad, "checksum"), (os.path.join(tmp, "missing.e8kc"), "I/O")]:
            p = run("-p", PROMPT, "-n", "4", "--load-cache", f, ok=False)
            if p.returncode == 0 or what not in p.stderr.decode():
                print(f"FAIL: a {what} error was not reported: {p.returncode} {p.stderr.decode()!r}")
                failures += 1
    print("PASS" if failures == 0 else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
