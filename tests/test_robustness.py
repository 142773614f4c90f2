"""Bad inputs and failing disks met by the command line: each ends in one line (exit 2), and
what was written is whole (no half file for a later call to take as a finished one)."""

import errno
import os

from flnotes.cli.main import main
from flnotes.repro import notebooks


def _error_line(capsys) -> str:
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    errors = [line for line in (out.out + out.err).splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: "), out.out + out.err
    return errors[0]


# ---- notebooks DEST ------------------------------------------------------------------------
def test_notebooks_on_a_full_disk_leave_no_half_copy_and_copy_it_next_time(tmp_path, capsys,
                                                                           monkeypatch):
    real, count = notebooks.write_atomically, [0]

    def full_at_the_third(path, write):
        count[0] += 1
        if count[0] != 3:
            return real(path, write)

        def half(f):
            f.write(b'{"cells": [')
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, half)

    monkeypatch.setattr(notebooks, "write_atomically", full_at_the_third)
    dest = tmp_path / "nb"
    assert main(["notebooks", str(dest)]) == 2
    line = _error_line(capsys)
    names = sorted(p.name for p in notebooks.NOTEBOOK_DIR.glob("*.ipynb"))
    third = dest / names[2]
    assert line.startswith(f"error: disk full: cannot write {third} "), line
    assert str(notebooks.NOTEBOOK_DIR) not in line  # the package's file is not the problem
    assert sorted(p.name for p in dest.iterdir()) == names[:2]  # no half copy, no .tmp
    monkeypatch.undo()
    assert main(["notebooks", str(dest)]) == 0
    out = capsys.readouterr().out
    assert f"kept {third}" not in out and f"kept {dest / names[0]}" in out
    assert third.read_bytes() == (notebooks.NOTEBOOK_DIR / names[2]).read_bytes()


def test_notebooks_into_an_unwritable_folder_names_the_destination(tmp_path, capsys,
                                                                   monkeypatch):
    def refused(path, write):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(notebooks, "write_atomically", refused)
    assert main(["notebooks", str(tmp_path / "nb")]) == 2
    line = _error_line(capsys)
    assert line.startswith("error: Permission denied: " + str(tmp_path / "nb")), line
