"""Generate the committed gRPC code from proto/, or check that it is current.

python tools/gen_proto.py          # regenerate src/luftpause/_proto
python tools/gen_proto.py --check  # exit 1 if the committed code is stale
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "src" / "luftpause" / "_proto"


def generate(into: Path) -> list[Path]:
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    for proto in protos:
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"-I{include}",
                f"--python_out={into}",
                f"--pyi_out={into}",
                f"--grpc_python_out={into}",
                str(proto),
            ]
        )
        if rc != 0:
            raise SystemExit(f"protoc failed on {proto.relative_to(ROOT)} (exit {rc})")
    # Make every generated directory a package so `luftpause._proto.luftpause...` imports.
    for directory in [into, *[p for p in into.rglob("*") if p.is_dir()]]:
        (directory / "__init__.py").touch()
    fix_imports(into)
    return sorted(p.relative_to(into) for p in into.rglob("*") if p.is_file())


def fix_imports(into: Path) -> None:
    """protoc writes absolute imports from the proto root; anchor them under our package."""
    for path in into.rglob("*_pb2*.py*"):
        text = path.read_text()
        text = text.replace("from luftpause.scheduler", "from luftpause._proto.luftpause.scheduler")
        path.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        files = generate(fresh)
        if args.check:
            stale = [
                str(f)
                for f in files
                if not (OUT / f).exists() or not filecmp.cmp(fresh / f, OUT / f, shallow=False)
            ]
            if stale:
                print("generated gRPC code is stale; run `make proto`:", *stale, sep="\n  ")
                return 1
            print(f"generated gRPC code matches proto/ ({len(files)} files)")
            return 0
        if OUT.exists():
            shutil.rmtree(OUT)
        shutil.copytree(fresh, OUT)
        print(f"wrote {len(files)} files under {OUT.relative_to(ROOT)}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
