#!/usr/bin/env python3
"""`e8kv tokenize` against the reference tokenizers, id for id.

1. SmolLM2-135M-Instruct (GGUF "gpt2" vocabulary, pre "smollm") against Hugging Face `tokenizers` with the
   model's tokenizer.json: the WHOLE of wikitext-2-raw/wiki.test.raw as one text, tricky strings and a sweep
   over every Unicode code point. How the text is fed: the file's bytes go to the CLI (-f); the reference
   gets the same bytes decoded as UTF-8 and calls Tokenizer.encode(text, add_special_tokens=False); the
   CLI runs with --no-bos (SmolLM2's own setting adds none either).
2. stories260K tok512 (SentencePiece BPE) against the `sentencepiece` package: through a GGUF "llama"
   vocabulary written from tok512.model with the `gguf` package, and through llama2.c's tok512.bin. Only
   texts where SentencePiece's whitespace normalization (remove_extra_whitespaces) changes nothing;
   tests/test_tokenizer.c covers the others against a port of llama2.c.

Skips (exit 77) when the CLI, tokenizers, the data or the model are missing; part 2 is skipped on its own
when sentencepiece or gguf is missing.
"""
import os
import subprocess
import sys
import tempfile
import time


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


try:
    from tokenizers import Tokenizer
except ImportError:
    skip("python package tokenizers not installed")

CLI = os.environ.get("E8KV_CLI")
DATA = os.environ.get("E8KV_SHARED_DATA", os.path.join(os.path.dirname(__file__), "../data"))
if not CLI or not os.path.exists(CLI):
    skip("E8KV_CLI not set (run through ctest)")
TOK_JSON = os.path.join(DATA, "smollm2-135m/tokenizer.json")
WIKI = os.path.join(DATA, "wikitext-2-raw/wiki.test.raw")
for p in (TOK_JSON, WIKI):
    if not os.path.exists(p):
        skip("missing test data " + p)
MODEL = os.environ.get("E8KV_MODEL") or os.path.join(
    os.environ.get("E8KV_CACHE_DIR") or os.path.expanduser("~/.cache/e8kv"), "SmolLM2-135M-Instruct.Q4_1.gguf")
if not os.path.exists(MODEL):
    skip("default model missing (%s): run scripts/fetch_model.sh" % MODEL)

failures = []


def check(name, ok, detail=""):
    print("%-4s %s%s" % ("ok" if ok else "FAIL", name, (": " + detail) if detail and not ok else ""))
    if not ok:
        failures.append(name)


def cli(args, stdin=None):
    r = subprocess.run([CLI, "tokenize"] + args, input=stdin, capture_output=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("e8kv tokenize %s failed: %s" % (" ".join(args), r.stderr.decode(errors="replace")))
    return r.stdout.decode(), r.stderr.decode()


def cli_batch(model_args, texts):
    """Tokenize each text on its own (-0: NUL-separated input, one line of ids per text)."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(b"\0".join(t.encode("utf-8") for t in texts))
        f.flush()
        out, _ = cli(model_args + ["-f", f.name, "-0"])
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == len(texts) + 1, (len(lines), len(texts))
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return "first difference at %d: ref %s, e8kv %s" % (i, a[max(0, i - 3):i + 5], b[max(0, i - 3):i + 5])
    return "lengths differ: ref %d, e8kv %d" % (len(a), len(b))


def compare_batch(name, model_args, texts, reference):
    got = cli_batch(model_args, texts)
    bad = [(t, r, g) for t, r, g in zip(texts, (reference(t) for t in texts), got) if r != g]
    detail = ""
    if bad:
        t, r, g = bad[0]
        detail = "%d of %d differ, e.g. %r: ref %s, e8kv %s" % (len(bad), len(texts), t[:80], r[:20], g[:20])
    check(name, not bad, detail)


# ---------------------------------------------------------------- 1. SmolLM2 vs tokenizers
hf = Tokenizer.from_file(TOK_JSON)
def hf_ids(t):
    return hf.encode(t, add_special_tokens=False).ids


raw = open(WIKI, "rb").read()
ref = hf_ids(raw.decode("utf-8"))
t0 = time.time()
out, err = cli(["-m", MODEL, "-f", WIKI, "--no-bos"])
wall = time.time() - t0
got = [int(x) for x in out.split()]
check("wiki.test.raw: %d tokens identical" % len(ref), got == ref, first_diff(ref, got))
print("     e8kv: " + err.strip() + " (wall %.2f s with model load)" % wall)
check("wiki.test.raw tokenized within seconds", wall < 20, "%.1f s" % wall)

TRICKY = [
    "", " ", "  ", "\n", "\n\n\n", " \n ", "\t\t x", "a  b", "a   b  ", "x \n\n y", "   leading", "trailing   ",
    "I'm don't can't we've they're you'll he'd 'S 'M I'M O'Neil '' ''s 'sx",
    "12345 1,234,567.89 3.14159 2024-01-01 0x1F 1e-9 ½ ² ³ ٣٤٥ ߁ Ⅻ ①②",
    "abc123def 123abc  456  ",
    "Ünïcödé façade naïve 東京 Ελληνικά русский العربية हिन्दी 한국어 ไทย",
    "emoji 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ☃",
    "zero\u200bwidth\u200djoiner\ufeffbom \u00a0nbsp \u3000ideo \u2028ls \u2029ps \u0085nel \x0b\x0c",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "a<|im_start|>b <|im_end|> <|endoftext|><|endoftext|>x<|im_start",
    "<repo_name>e8kv<file_sep>src/main.c<filename>x<gh_stars>100<issue_start>",
    "punctuation!!! ??? ... --- ___ *** ((( ))) [[[ ]]] {{{ }}} ;;; ::: \"\"\" ''' ``` ~~~ @@@ ### $$$ %%% ^^^ &&&",
    "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\r\n",
    "https://example.com/path?q=1&r=2#frag user@example.org",
    "control \x01\x02\x03\x04\x06\x13\x1c\x1f\x7f chars",
    "    " * 40 + "x" + "\n" * 30 + "y" + " " * 100,
    "a" * 3000,
    " ".join(["word"] * 500),
]
compare_batch("tricky strings (%d)" % len(TRICKY), ["-m", MODEL], TRICKY, hf_ids)

# Code points in a few contexts (no surrogates, no NUL: it separates the -0 texts). All of them with
# E8KV_TOKENIZER_FULL_SWEEP=1 (about 1.5 min, nearly all in the reference); by default every point where the
# letter / number / space class changes (and its predecessor), U+0001..U+03FF, and a fixed random sample.
cps = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
if os.environ.get("E8KV_TOKENIZER_FULL_SWEEP") != "1":
    import random
    import unicodedata
    def cls(c):
        k = unicodedata.category(chr(c))[0]
        return k if k in "LN" else "S" if chr(c).isspace() or c == 0x85 else "-"
    prev, picked = None, set(range(1, 0x400))
    for c in cps:
        k = cls(c)
        if k != prev:
            picked.update((c - 1, c))
        prev = k
    picked.update(random.Random(1).sample(cps, 5000))
    cps = sorted(c for c in picked if 0 < c and not 0xD800 <= c <= 0xDFFF)
sweep = []
for i in range(0, len(cps), 4096):
    sweep.append("".join("%s%sx %s1 %s" % (chr(c), chr(c), chr(c), chr(c)) for c in cps[i:i + 4096]))
compare_batch("%d code points (%d texts)" % (len(cps), len(sweep)), ["-m", MODEL], sweep, hf_ids)

# ---------------------------------------------------------------- 2. SentencePiece (stories260K)
try:
    import gguf
    import sentencepiece as spm
except ImportError:
    gguf = spm = None
SP_MODEL = os.path.join(DATA, "stories260K/tok512.model")
TOK_BIN = os.path.join(DATA, "stories260K/tok512.bin")
if spm is None or not os.path.exists(SP_MODEL) or not os.path.exists(TOK_BIN):
    print("skip SentencePiece part: sentencepiece/gguf packages or stories260K data missing")
else:
    sp = spm.SentencePieceProcessor(model_file=SP_MODEL)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tok512.gguf")
        w = gguf.GGUFWriter(path, "llama")
        tokens, scores, types = [], [], []
        for i in range(sp.get_piece_size()):
            tokens.append(sp.id_to_piece(i).encode("utf-8"))
            scores.append(sp.get_score(i))
            types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                         else 5 if sp.is_unused(i) else 1)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_unk_token_id(sp.unk_id())
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

        stories = open(os.path.join(DATA, "tinyshakespeare/input.txt"), encoding="utf-8").read()[:20000]
        texts = [
            "Once upon a time, there was a little girl named Lily.",
            "Hello world", "x\n\nOnce", "a\tb", "a \n b", "café naïve", "你好, 世界", "emoji 😀 👍🏽",
            "12 + 34 = 46", "don't stop; it's 3:45pm", "<s> and </s> are plain text", "ZZZZZZZZZZqqqqqqqq",
        ]
        # whole paragraphs of real text, whitespace-normalized so SentencePiece and llama2.c agree
        texts += [" ".join(p.split()) for p in stories.split("\n\n") if p.strip()][:200]
        def sp_ids(t):
            return [sp.bos_id()] + sp.encode(t)
        compare_batch("sentencepiece via GGUF llama vocabulary (%d texts)" % len(texts), ["-m", path], texts, sp_ids)
        compare_batch("sentencepiece via llama2.c tok512.bin (%d texts)" % len(texts),
                      ["--llama2c-tokenizer", TOK_BIN, "--vocab-size", "512"], texts, sp_ids)

# ---------------------------------------------------------------- 3. Llama 3 and Qwen2 pre-tokenizers
# SmolLM2's vocabulary and merges under the other regexes: the reference is SmolLM2's tokenizer.json with the
# pre_tokenizer of Llama 3's tokenizer.json (Split(Regex, Isolated) then ByteLevel without its own regex, no
# normalizer); the engine gets a copy of the model GGUF whose tokenizer.ggml.pre is changed. SmolLM2 splits
# digits itself and has no multi-digit token, which would hide how many digits a piece takes: both sides get
# the same extra tokens (every 2- and 3-digit string, and 4-digit ones) with merges ranked after the others.
# Likewise "¿a" (byte-mapped text: the last byte of U+017F LONG S, then a) makes "'ſam" show whether 'ſ is
# taken as the contraction 's, as Oniguruma's case folding does, and "Ċa", "ča" (\n a, \r a) that a line
# break may not lead a letter run, and "!Ċ", ".Ċ" that punctuation keeps the line breaks after it.
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")
ADVERSARIAL = [
    "I'M they'RE 's'S 'sx 'Sx 'LL 'Ll 'lL 'VE 'Re 'T 'D 'M don'T O'NEIL '' ''s ' s 'ſ 'ſt x'ſ x'ſam x'ſa I'ſa. (ſa",
    "'Sam x'Tom x'Dan x'Mary x'sam x'tom x'dan x'mary x'Sa x'Ta x'Ma x'Da x'REa x'VEa x'LLa",
    "1234567 12 3", "1 12 123 1234 12345 123456 1234567", "a1234567b 1,234,567.89 ½²³ ٣٤٥٦٧ ①②③④",
    ".Hello (word —dash \"quote 'apos ..Hello  .x \t.x \n.x \u00a0.x \u3000x",
    "a \n\n b", "x\r\n\r\ny", "  \n  z", "end   ", " \n", "\n ", "\r", "\r\r\n x", " \t\n\t y", "\t\tx",
    "tabs\tand\t\ttabs \t x", "a\n", "a\n\n", "   ", "\n\n\n   \n", "x  \r\n  \r\n  ",
    "x\na \na\n\na\r\na\ra", "!!!\na\n", "end.\nnext x!\ny", "!!!\n\n", "!!!\r\n\r\n x", " ???\n", " !!! \n", "...\n\n\nabc", "(\nx", ",\u2028x",
    "é ü café naïve e\u0301te\u0301 a\u0308\u0308b ÉCOLE", "Ελληνικά ΕΛΛΗΝΙΚΆ", "日本語のテキスト。東京", "emoji 😀😃x 👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "русский, العربية हिन्दी 한국어 ไทย", "\u0301abc \u0301\u0301abc x\u200dy \ufeffz",
    "<|im_start|>user\nHi!<|im_end|>\n", "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\r\n",
    "    " * 20 + "x" + "\n" * 10 + "y" + " " * 50,
    "x " + "q" * 300,  # EXTRA_WHOLE's longest: a word of more bytes than the 512-byte stack buffer maps
    "zqxjv zqxjv. qwzz zqxjvx qwzz!",  # EXTRA_WHOLE: tokens no merge reaches
]
try:
    import gguf
except ImportError:
    gguf = None


EXTRA_MERGES = ([(a, b) for a in "0123456789" for b in "0123456789"] +
                [(a + b, c) for a in "0123456789" for b in "0123456789" for c in "0123456789"] +
                [(a, "4") for a in ("123", "234", "345", "456", "567", "999", "000")] +
                [("\u00bf", "a"), ("\u010a", "a"), ("\u010d", "a"), ("!", "\u010a"), (".", "\u010a")])


# Tokens that no merge makes (byte-mapped texts: Ġ is a space): Llama 3's ignore_merges takes a word that is
# one of them whole (" zqxjv", " qwzz"), qwen2 (no ignore_merges) merges its bytes as far as the merges go
EXTRA_WHOLE = ["\u0120zqxjv", "zqxjv", "\u0120qwzz", "\u0120" + "q" * 300]


def gguf_with_pre(src, dst, pre):
    """A copy of a GGUF with tokenizer.ggml.pre set to pre and EXTRA_MERGES (then EXTRA_WHOLE) added."""
    from gguf_copy import copy_gguf
    n = len(EXTRA_MERGES) + len(EXTRA_WHOLE)
    copy_gguf(src, dst, set_keys=[("tokenizer.ggml.pre", pre, gguf.GGUFValueType.STRING)],
              extend_keys={"tokenizer.ggml.tokens": [a + b for a, b in EXTRA_MERGES] + EXTRA_WHOLE,
                           "tokenizer.ggml.token_type": [1] * n, "tokenizer.ggml.scores": [0.0] * n,
                           "tokenizer.ggml.merges": ["%s %s" % m for m in EXTRA_MERGES]})


if gguf is None:
    print("skip llama-bpe / qwen2 part: gguf package missing")
else:
    import json
    base = json.load(open(TOK_JSON, encoding="utf-8"))
    vocab = dict(base["model"]["vocab"])
    assert len(vocab) == len(gguf.GGUFReader(MODEL).fields["tokenizer.ggml.tokens"].data), "ids would not line up"
    for a, b in EXTRA_MERGES:
        vocab[a + b] = len(vocab)
    for w in EXTRA_WHOLE:
        vocab[w] = len(vocab)
    base["model"] = dict(base["model"], vocab=vocab, merges=base["model"]["merges"] + ["%s %s" % m for m in EXTRA_MERGES])
    smollm_adv = [hf_ids(t) for t in ADVERSARIAL]
    with tempfile.TemporaryDirectory() as d:
        for pre, regex in (("llama-bpe", LLAMA3_RE), ("llama3", LLAMA3_RE), ("qwen2", QWEN2_RE)):
            j = dict(base, normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]})
            j["model"] = dict(j["model"], ignore_merges=pre != "qwen2")  # as Llama 3's tokenizer.json
            ref_tok = Tokenizer.from_str(json.dumps(j))
            def ref_ids(t, ref_tok=ref_tok):
                return ref_tok.encode(t, add_special_tokens=False).ids
            path = os.path.join(d, pre + ".gguf")
            gguf_with_pre(MODEL, path, pre)
            args = ["-m", path, "--no-bos"]
            ref = ref_ids(raw.decode("utf-8"))
            out, _ = cli(args + ["-f", WIKI])
            got = [int(x) for x in out.split()]
            check("%s: wiki.test.raw %d tokens identical" % (pre, len(ref)), got == ref, first_diff(ref, got))
            if pre == "llama3":
                continue  # an alias: the wiki text shows it reaches the same pre-tokenizer
            check("%s: the reference differs from SmolLM2's on the adversarial strings" % pre,
                  [ref_ids(t) for t in ADVERSARIAL] != smollm_adv)
            ids = ref_ids(ADVERSARIAL[-1])
            whole = sum(ids.count(vocab[w]) for w in EXTRA_WHOLE)  # zqxjv, ' zqxjv', ' qwzz' twice
            check("%s: EXTRA_WHOLE words taken whole %d times (ignore_merges %s)" % (pre, whole, pre != "qwen2"),
                  whole == (4 if pre != "qwen2" else 0))
            long_word = ref_ids(ADVERSARIAL[-2]).count(vocab[EXTRA_WHOLE[3]])  # ' q' * 300: one token, or none
            check("%s: a 301-byte word that is a token taken whole %d times" % (pre, long_word),
                  long_word == (1 if pre != "qwen2" else 0))
            texts = ADVERSARIAL + TRICKY
            n_tok = sum(len(ref_ids(t)) for t in texts)
            compare_batch("%s: adversarial strings (%d, %d tokens)" % (pre, len(texts), n_tok), args, texts, ref_ids)
            compare_batch("%s: %d code points (%d texts)" % (pre, len(cps), len(sweep)), args, sweep, ref_ids)
        path = os.path.join(d, "unknown.gguf")
        gguf_with_pre(MODEL, path, "no-such-pre")
        r = subprocess.run([CLI, "tokenize", "-m", path, "-f", WIKI], capture_output=True, timeout=120)
        err = r.stderr.decode(errors="replace")
        check("unknown tokenizer.ggml.pre is refused as unsupported", r.returncode != 0 and "unsupported" in err.lower(),
              "rc %d, stderr %r" % (r.returncode, err[-200:]))

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
