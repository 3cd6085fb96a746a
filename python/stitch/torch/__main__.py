"""python -m stitch.torch [options] SCRIPT [ARGS...] | -m MODULE [ARGS...] | build-native

Runs an unmodified PyTorch program with stitch as its CUDA allocator: stitch.torch.enable() first,
then the script as __main__ (sys.argv and sys.path[0] set as `python SCRIPT ARGS` would).

Options (before SCRIPT):
  --conf CONF             stitch configuration applied on top of STITCH_ALLOC_CONF
                          (e.g. expandable_segments:True,max_split_size_mb:256)
  --spill tags|all        when a request would run out of memory, move cold live memory to
                          host pages under the same addresses instead (adds spill:tags|all
                          and expandable_segments:True to the configuration; docs/spill.md)
  --backup-dir DIR        sleep's disk tier: backups that pinned host memory cannot take go to
                          files in DIR (created if missing; no ',' in it), private to the process
                          (adds backup_dir:DIR; docs/sleep.md)
  --backup-host-mb N      pinned host memory the backups may take, in MiB, before they go to
                          --backup-dir (adds backup_host_mb:N)
  --no-oom-translation    leave stitch's out-of-memory errors as PyTorch raised them
                          (RuntimeError/MemoryError) instead of torch.OutOfMemoryError
                          (the pluggable hooks only: the native backend raises it itself)
  -m MODULE               run a module (as python -m MODULE) instead of a script
  -h, --help              this text

`python -m stitch.torch build-native` builds the native backend (libstitch_torch) for the torch
that is installed, ahead of its first use, and prints where it is.

Environment: STITCH_ALLOC_CONF (stitch's configuration), STITCH_LIBRARY (which libstitch.so),
STITCH_TORCH_BACKEND (auto, native or pluggable; see stitch.torch.enable).
Under torchrun each rank runs the launcher and enables its own allocator:
  torchrun --nproc-per-node 8 -m stitch.torch train.py --steps 100
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import List, Optional

from .._lib import LibraryNotFoundError, StitchError

_USAGE = __doc__ or ""


def _parse(argv: List[str]):
    conf: Optional[str] = None
    spill: Optional[str] = None
    backup: List[str] = []  # backup_dir / backup_host_mb items
    translate = True
    module: Optional[str] = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            return None
        if a == "--":
            i += 1
            break
        if a == "--conf" or a.startswith("--conf="):
            conf, i = _value(argv, i, "--conf", "")
            continue
        if a == "--spill" or a.startswith("--spill="):
            spill, i = _value(argv, i, "--spill", " (tags or all)")
            if spill not in ("tags", "all"):
                raise SystemExit(f"stitch.torch: --spill takes tags or all, not {spill!r}")
            continue
        if a == "--backup-dir" or a.startswith("--backup-dir="):
            path, i = _value(argv, i, "--backup-dir", " (a directory)")
            backup.append("backup_dir:" + _backup_dir(path))
            continue
        if a == "--backup-host-mb" or a.startswith("--backup-host-mb="):
            mb, i = _value(argv, i, "--backup-host-mb", " (MiB)")
            if not mb.isdigit():
                raise SystemExit(f"stitch.torch: --backup-host-mb takes a number of MiB, not {mb!r}")
            backup.append(f"backup_host_mb:{int(mb)}")
            continue
        if a == "--no-oom-translation":
            translate, i = False, i + 1
            continue
        if a == "-m":
            if i + 1 >= len(argv):
                raise SystemExit("stitch.torch: -m needs a module name")
            module = argv[i + 1]
            return _with_extras(conf, spill, backup), translate, module, None, argv[i + 2:]
        if a.startswith("-") and a != "-":
            raise SystemExit(f"stitch.torch: unknown option {a} (see --help)")
        break
    if i >= len(argv):
        raise SystemExit("stitch.torch: no script given (see --help)")
    return _with_extras(conf, spill, backup), translate, None, argv[i], argv[i + 1:]


def _value(argv: List[str], i: int, option: str, what: str):
    """The value of the option at argv[i] (`--option value` or `--option=value`), and the index
    after it."""
    if argv[i] == option:
        if i + 1 >= len(argv):
            raise SystemExit(f"stitch.torch: {option} needs a value{what}")
        return argv[i + 1], i + 2
    return argv[i].split("=", 1)[1], i + 1


def _backup_dir(path: str) -> str:
    """--backup-dir's directory as backup_dir takes it: absolute; refused with a clear message
    when the configuration syntax cannot carry it (a ',' or a control character)."""
    if not path:
        raise SystemExit("stitch.torch: --backup-dir needs a directory")
    full = os.path.abspath(os.path.expanduser(path))
    if "," in full or any(ord(c) < 0x20 or ord(c) == 0x7F for c in full):
        raise SystemExit(f"stitch.torch: --backup-dir {path!r}: a directory whose path has a ',' or a "
                         "control character cannot be given to stitch (its configuration is key:value,...)")
    return full


def _with_extras(conf: Optional[str], spill: Optional[str], backup: List[str]) -> Optional[str]:
    """--conf with what --spill (spill needs expandable segments), --backup-dir and
    --backup-host-mb add, after it."""
    extras = ([f"expandable_segments:True,spill:{spill}"] if spill is not None else []) + backup
    if not extras:
        return conf
    extra = ",".join(extras)
    return extra if conf is None else f"{conf},{extra}"


def main(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["build-native"]:
        from . import _native

        try:
            print(_native.build(verbose="-v" in args[1:]))
        except Exception as e:  # noqa: BLE001 - reported, not raised
            raise SystemExit(f"stitch.torch build-native: {e}") from None
        return
    parsed = _parse(args)
    if parsed is None:
        sys.stdout.write(_USAGE)
        return
    conf, translate, module, script, rest = parsed

    from . import enable, raise_torch_oom

    try:
        enable(conf)
    except (StitchError, LibraryNotFoundError) as e:
        raise SystemExit(str(e)) from None

    if module is not None:
        sys.argv = [module, *rest]  # run_module(alter_sys=True) replaces argv[0] with the path
        target = lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        assert script is not None
        if not os.path.exists(script):
            raise SystemExit(f"stitch.torch: can't open file {script!r}")
        sys.argv = [script, *rest]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        target = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731

    if translate:
        with raise_torch_oom():
            target()
    else:
        target()


if __name__ == "__main__":
    main()
