#!/usr/bin/env python3
"""Draw the pictures of README.md / BENCHMARKS.md from the JSON the CLI prints.

    python scripts/plots.py              # run the measurements (below), then draw doc/img/*.png
    python scripts/plots.py --no-run     # redraw from the JSON kept in doc/img/*.json*

Measurements (each JSON file is kept next to the PNGs):
  codec_gauss.jsonl  e8kv bench codec --json --n-vec 16384 --reps 1            (i.i.d. Gaussian, head_dim 64)
  ppl_smollm2.jsonl  e8kv ppl -f wiki.test.raw --ctx 512 --chunks N --json --kv ... (the default model)
  sensitivity_smollm2.json  the per-layer sensitivities of `e8kv calibrate -f tinyshakespeare/input.txt
                     --chunks 4` (a temporary calibration, also used by the e8tv rows of the ppl run)
  diagnostics_smollm2.json  e8kv calibrate --from CALIB -f wiki.test.raw --check --check-chunks 4 --json
                     (its K/V shares, AM/GM and the rank check of 9 allocations at 3 bits per value)

Pictures:
  rate_distortion.png    SNR against bits per value for every codec, with the Shannon bound 6.02 dB/bit
  ppl_vs_bits.png        KLD and PPL increase against bits per value, every format on the default model
  sensitivity.png        per-layer K and V sensitivities of the calibration (KLD coefficient c, KLD ~ c 4^-B)
  diagnostics.png        K share of each layer's sensitivity, the layers' share, AM/GM; predicted against
                         measured KLD of the --check allocations with Spearman's rho
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMG = os.path.join(ROOT, "doc", "img")
DATA = os.environ.get("E8KV_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))

PPL_FORMATS = ["f16", "q8_0", "q8_0h", "q4_0", "q4_0h", "lloyd:4", "lloyd:3", "lloyd:2", "e8:4", "e8:3", "e8:2",
               "e8box:4", "e8v:4", "e8v:3", "e8v:2", "e8nest:4", "e8tv:4", "e8tv:3", "e8tv:2",
               "auto=e8tv:3", "auto=e8tv:2"]


def run(cmd, out_path):
    print("$", " ".join(shlex.quote(c) for c in cmd), ">", os.path.relpath(out_path, ROOT), flush=True)
    with open(out_path, "w") as f:
        subprocess.run(cmd, stdout=f, check=True)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def family(spec):
    s = spec.split(",")[0]
    if s.startswith("auto="):
        return "auto=" + s[5:].split(":")[0]
    return s.split(":")[0]


def plot_rate_distortion(rows, path, plt):
    fig, ax = plt.subplots(figsize=(8, 5.5))
    groups = {}
    for r in rows:
        if r.get("skipped"):
            continue
        key = (family(r["codec"].replace("-ecq", "-ecq:")), r["kind"])
        groups.setdefault(key, []).append(r)
    for (fam, kind), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["bits_per_value"])
        xs = [r["bits_per_value"] for r in rs]
        ys = [r["snr_db"] for r in rs]
        style = "o-" if kind == "fixed" else "s--"
        label = fam + (" (entropy, ideal)" if kind != "fixed" else "")
        ax.plot(xs, ys, style, label=label, markersize=4, linewidth=1)
    lo = min(r["bits_per_value"] for r in rows if not r.get("skipped"))
    hi = max(r["bits_per_value"] for r in rows if not r.get("skipped") and r["bits_per_value"] <= 9)
    ax.plot([lo, hi], [6.0206 * lo, 6.0206 * hi], "k-", linewidth=2, label="Shannon bound D(R) = σ²·2^(−2R)")
    ax.set_xlim(lo - 0.2, hi + 0.2)
    ax.set_ylim(0, 6.0206 * hi + 3)
    ax.set_xlabel("bits per value (every byte counted)")
    ax.set_ylabel("SNR (dB) = −10·log10(MSE/σ²)")
    ax.set_title("Rate–distortion on i.i.d. Gaussian vectors, head_dim %d" % rows[0].get("head_dim", 64))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ppl(rows, path, plt):
    base = next(r for r in rows if r["spec"] == "f32")
    rows = [r for r in rows if r.get("available", True) and r["spec"] != "f32" and "kld" in r]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.8))
    fams = {}
    for r in rows:
        fams.setdefault(family(r["spec"]), []).append(r)
    for fam, rs in sorted(fams.items()):
        rs.sort(key=lambda r: r["bits_per_value"])
        xs = [r["bits_per_value"] for r in rs]
        a1.plot(xs, [max(r["kld"], 1e-6) for r in rs], "o-", label=fam, markersize=4)
        a2.plot(xs, [100 * (r["ppl"] / base["ppl"] - 1) for r in rs], "o-", label=fam, markersize=4)
        for r in rs:
            a1.annotate(r["spec"].split(",")[0], (r["bits_per_value"], max(r["kld"], 1e-6)), fontsize=5,
                        xytext=(2, 2), textcoords="offset points")
    a1.set_yscale("log")
    a1.set_ylabel("KL divergence vs f32 (nats/token)")
    a2.set_ylabel("PPL increase over f32 (%)")
    a2.set_yscale("symlog", linthresh=0.5)
    for a in (a1, a2):
        a.set_xlabel("bits per value (formats' rate, side information counted)")
        a.grid(alpha=0.3)
    a1.legend(fontsize=7, ncol=2)
    fig.suptitle("SmolLM2-135M-Instruct (Q4_1), wiki.test.raw, %d chunks of %d: f32 PPL %.3f" %
                 (base["chunks"], base["ctx"], base["ppl"]))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sensitivities(calib_path, out_json):
    """Per-layer K/V sensitivities of a calibration (read through the Python package) into a JSON file."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    lib = os.path.join(ROOT, "build", "libe8kv.so")
    if not os.environ.get("E8KV_LIB") and os.path.exists(lib):
        os.environ["E8KV_LIB"] = lib
    import e8kv
    cal = e8kv.Calib.load(calib_path)
    n_layer = cal.info()[0]
    d = {"calibration": os.path.basename(calib_path), "k": [cal.sensitivity(i, False) for i in range(n_layer)],
         "v": [cal.sensitivity(i, True) for i in range(n_layer)]}
    if min(d["k"] + d["v"]) < 0:
        raise SystemExit(f"{calib_path} has no sensitivities (calibrate without --no-sensitivity)")
    with open(out_json, "w") as f:
        json.dump(d, f)
        f.write("\n")


def plot_sensitivity(sens_json, path, plt):
    with open(sens_json) as f:
        d = json.load(f)
    k, v, n_layer = d["k"], d["v"], len(d["k"])
    fig, ax = plt.subplots(figsize=(10, 4))
    xs = list(range(n_layer))
    ax.bar([x - 0.2 for x in xs], k, width=0.4, label="K")
    ax.bar([x + 0.2 for x in xs], v, width=0.4, label="V")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("sensitivity c (KLD ≈ c·4^(−B), nats/token)")
    ax.set_title(f"Per-layer K/V sensitivities of {d['calibration']} (what auto=e8tv:B water-fills)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_diagnostics(diag_json, path, plt):
    with open(diag_json) as f:
        d = json.load(f)
    layers = d["layers"]
    xs = [l["layer"] for l in layers]
    tot = sum(l["sens_k"] + l["sens_v"] for l in layers)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1.5, 1]})
    a1.bar(xs, [100 * l["k_share"] for l in layers], width=0.8, label="K share of the layer's sensitivity")
    a1.plot(xs, [100 * (l["sens_k"] + l["sens_v"]) / tot for l in layers], "o-", color="C3",
            label="the layer's share of all layers")
    a1.axhline(50, color="gray", lw=0.8, ls=":")
    a1.set_xlabel("layer")
    a1.set_ylabel("%")
    a1.set_title(f"K vs V sensitivity per layer; AM/GM of the layers {d['am_gm_layers']:.3f}, "
                 f"of the streams {d['am_gm_streams']:.3f}", fontsize=10)
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3, axis="y")
    c = d.get("check")
    if c:
        for a in c["allocations"]:
            a2.scatter(a["predicted_kld"], a["kld"], color="C0")
            a2.errorbar(a["predicted_kld"], a["kld"], yerr=a["kld_se"], color="C0", lw=0.8)
            a2.annotate(a["name"], (a["predicted_kld"], a["kld"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        lo = min(min(a["predicted_kld"], a["kld"]) for a in c["allocations"]) * 0.8
        hi = max(max(a["predicted_kld"], a["kld"]) for a in c["allocations"]) * 1.25
        a2.plot([lo, hi], [lo, hi], color="gray", lw=0.8, ls=":")
        a2.set_xscale("log")
        a2.set_yscale("log")
        a2.set_xlabel("predicted KLD  sum_s c_s 4^-r_s (nats)")
        a2.set_ylabel("measured KLD (nats)")
        a2.set_title(f"{len(c['allocations'])} allocations of {c['rate']:g} bits, {c['tokens_scored']} tokens: "
                     f"Spearman rho {c['spearman']:.3f}", fontsize=10)
        a2.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-run", action="store_true", help="redraw from doc/img/*.jsonl without measuring")
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "e8kv"))
    ap.add_argument("--chunks", type=int, default=4, help="ppl chunks of 512 tokens (default 4)")
    ap.add_argument("--calib", help="calibration with sensitivities (default: make doc/img/smollm2.e8cal)")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(IMG, exist_ok=True)
    codec_json = os.path.join(IMG, "codec_gauss.jsonl")
    ppl_json = os.path.join(IMG, "ppl_smollm2.jsonl")
    sens_json = os.path.join(IMG, "sensitivity_smollm2.json")
    diag_json = os.path.join(IMG, "diagnostics_smollm2.json")
    tmp = tempfile.TemporaryDirectory()
    calib = a.calib or os.path.join(tmp.name, "smollm2-tinyshakespeare.e8cal")
    if not a.no_run:
        t = ["--threads", str(a.threads)] if a.threads else []
        run([a.cli, "bench", "codec", "--json", "--n-vec", "16384", "--reps", "1"], codec_json)
        if not a.calib:
            subprocess.run([a.cli, "calibrate", "-f", os.path.join(DATA, "tinyshakespeare", "input.txt"),
                            "--chunks", "4", "-o", calib, *t], check=True, stdout=subprocess.DEVNULL)
        kv = sum([["--kv", f + (",sink=1" if f.startswith(("auto", "e8tv")) else "")] for f in PPL_FORMATS], [])
        run([a.cli, "ppl", "-f", os.path.join(DATA, "wikitext-2-raw", "wiki.test.raw"), "--ctx", "512", "--chunks",
             str(a.chunks), "--calib", calib, "--json", *t, "--kv", "f32", *kv], ppl_json)
        sensitivities(calib, sens_json)
        run([a.cli, "calibrate", "--from", calib, "-f", os.path.join(DATA, "wikitext-2-raw", "wiki.test.raw"),
             "--check", "--check-chunks", "4", "--json", *t], diag_json)
    plot_rate_distortion(read_jsonl(codec_json), os.path.join(IMG, "rate_distortion.png"), plt)
    plot_ppl(read_jsonl(ppl_json), os.path.join(IMG, "ppl_vs_bits.png"), plt)
    plot_sensitivity(sens_json, os.path.join(IMG, "sensitivity.png"), plt)
    plot_diagnostics(diag_json, os.path.join(IMG, "diagnostics.png"), plt)
    print("wrote", ", ".join(os.path.relpath(os.path.join(IMG, n), ROOT)
                             for n in ["rate_distortion.png", "ppl_vs_bits.png", "sensitivity.png",
                                       "diagnostics.png"]))


if __name__ == "__main__":
    main()
