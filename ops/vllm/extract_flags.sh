#!/usr/bin/env bash
# Regenerates the flag and parser lists of the pinned vLLM from its own argument parser, without
# a GPU: the wheel is unpacked (not installed) and its pure-Python import chain gets the few
# small packages it needs in a scratch folder. Run it when docker-compose.yml moves to another
# vLLM version; tests/unit/test_compose.py checks the compose flags against these lists.
set -euo pipefail
VERSION=${1:-0.33.0}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download -q --no-deps -d "$WORK/wheel" "vllm==$VERSION"
(cd "$WORK" && mkdir src && cd src && "$PY" -m zipfile -e ../wheel/vllm-*.whl .)
"$PY" -m pip install -q --no-deps --target "$WORK/deps" cbor2 pyzmq openai-harmony msgspec \
  cloudpickle pybase64 cachetools partial-json-parser xgrammar apache-tvm-ffi llguidance
VLLM_TARGET_DEVICE=cpu PYTHONPATH="$WORK/src:$WORK/deps" "$PY" - "$HERE" "$VERSION" <<'PY'
import sys
from pathlib import Path

from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
from vllm.utils.argparse_utils import FlexibleArgumentParser

out, version = Path(sys.argv[1]), sys.argv[2]
parser = make_arg_parser(FlexibleArgumentParser())
flags = sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--")})
lists = {
    "serve-flags": flags,
    "tool-call-parsers": sorted(ToolParserManager.lazy_parsers),
    "reasoning-parsers": sorted(ReasoningParserManager.lazy_parsers),
}
for name, items in lists.items():
    (out / f"v{version}-{name}.txt").write_text("\n".join(items) + "\n")
    print(f"{name}: {len(items)}")
PY
