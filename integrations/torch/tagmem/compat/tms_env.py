"""``python -m tagmem.compat.tms_env``: prints the shell lines that make ``import
torch_memory_saver`` give tagmem's drop-in in every process started from that shell (see
_tms_env: Note [torch_memory_saver under its own name])."""

import shlex

from ._tms_env import ENABLE_VARIABLE, shim_path


def main():
    # The lines are meant for eval: the path is quoted, so no character in it (a "$(...)", a
    # quote, a space) is ever read by the shell as anything but the path.
    print(f"export {ENABLE_VARIABLE}=1")
    print(f'export PYTHONPATH={shlex.quote(shim_path())}"${{PYTHONPATH:+:$PYTHONPATH}}"')


if __name__ == "__main__":
    main()
