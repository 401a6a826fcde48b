"""Trim a public engine capture for tests/data/real/: keep every event but the Python frames
of the runtime and torch (``<built-in ...>``, ``torch/...``), most of a ``with_stack``
capture's bytes; the engine's own frames (SGLang's ``sglang/srt/``, vLLM's ``vllm/``), the
device work, the runtime calls and the ranges stay as they were.

    python tests/data/real/trim.py SOURCE.json.gz OUT.json.gz

Run once per file (README.md beside this script says which and from where); the tests read
the trimmed files, never this script.
"""

from __future__ import annotations

import gzip
import json
import re
import sys

ENGINE = re.compile(r"/sglang/srt/|(^|/)vllm/")


def trim(src: str, out: str) -> tuple[int, int]:
    with gzip.open(src, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    kept = [e for e in events
            if e.get("cat") != "python_function" or ENGINE.search(str(e.get("name", "")))]
    doc["traceEvents"] = kept
    with gzip.GzipFile(out, "wb", mtime=0) as fh:  # mtime 0: the same bytes on every run
        fh.write(json.dumps(doc, separators=(",", ":")).encode())
    return len(events), len(kept)


if __name__ == "__main__":
    n, k = trim(sys.argv[1], sys.argv[2])
    print(f"{sys.argv[2]}: kept {k} of {n} events")
