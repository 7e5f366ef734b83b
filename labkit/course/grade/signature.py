"""A part's signature: HMAC-SHA256 under a key file that the instructor's jobs read, so that `labkit grade merge`
refuses a part edited after it was graded (shards.py), naming the file.

**The key** is a file of at least 32 bytes, readable by its owner only (mode 0600, as ssh wants of a private key):
`--key FILE`, by default ``DEFAULT`` (~/.config/labkit/grade.key). The first `labkit grade --shard K/N` that finds
none makes one (64 hex digits from `secrets`; made under another name and linked into place, so that two jobs that
start at once keep one key). Every job of a class and the merge must read the same key: a home the nodes share, or
a copy on each. The boxes never see it (the grader covers it, as it covers the grader's home).

**What is signed**: a part's CSV, all its text but the signature's own line (the second, `# labkit grade signature
hmac-sha256:ID:HEX`), line ends read as `\\n`; its JSON, the object but its "signature", as canonical JSON (keys
sorted, no spaces). ID names the key (12 hex digits of a SHA-256 of it), so that a part signed with another key is
told from an edited one.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT", "LINE", "SignatureError", "Key", "csv_content", "json_content", "sign_files"]

DEFAULT = Path("~/.config/labkit/grade.key")  # --key's default, ~ expanded where it is read
LINE = "# labkit grade signature "  # the second line of a signed part's CSV, before the signature
MOST_BYTES = 1 << 16  # a key file is a few dozen bytes; a larger file is not one
_FORM = re.compile(r"hmac-sha256:([0-9a-f]{12}):([0-9a-f]{64})")


class SignatureError(ValueError):
    """A key file that cannot be used, or a signature that does not hold: the message names the file."""


def csv_content(lines: list[str]) -> bytes:
    """What a CSV's signature covers: its lines (the signature's own line left out), joined by newlines."""
    return ("labkit grade part csv\n" + "\n".join(lines)).encode("utf-8")


def json_content(whole: dict) -> bytes:
    """What a JSON part's signature covers: the object but its "signature", as canonical JSON."""
    rest = {k: v for k, v in whole.items() if k != "signature"}
    return ("labkit grade part json\n" + json.dumps(rest, sort_keys=True, ensure_ascii=False,
                                                     separators=(",", ":"))).encode("utf-8")


@dataclass(frozen=True)
class Key:
    """The key at `path`; `secret` None where no file is there; `made`: made just now."""

    path: Path
    secret: bytes | None
    made: bool = False

    @classmethod
    def at(cls, path: Path | None = None, make: bool = False) -> Key:
        """The key file at `path` (DEFAULT for None), made there first where `make` and there is none."""
        path = (path or DEFAULT).expanduser().absolute()
        made = False
        if make and not os.path.lexists(path):
            made = _make(path)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return cls(path, None)
        except OSError as e:
            raise SignatureError(f"--key {path}: cannot be read ({e.strerror})") from None
        if not stat.S_ISREG(info.st_mode) or info.st_size > MOST_BYTES:
            raise SignatureError(f"--key {path}: not a key file (a regular file of a few dozen bytes)")
        if info.st_mode & 0o077:
            raise SignatureError(f"--key {path}: others may read or write it (mode "
                                 f"{stat.S_IMODE(info.st_mode):04o}); a key is its owner's alone: chmod 600 {path}")
        secret = path.read_bytes().strip()
        if len(secret) < 32:
            raise SignatureError(f"--key {path}: {len(secret)} bytes, too short for a key (32 or more; remove it and "
                            "`labkit grade --shard` makes one of 64 hex digits)")
        return cls(path, secret, made)

    @property
    def id(self) -> str:
        """12 hex digits that name the key, not its secret."""
        return hashlib.sha256(b"labkit grade key id\n" + (self.secret or b"")).hexdigest()[:12]

    def sign(self, content: bytes) -> str:
        """The signature of `content`: hmac-sha256:ID:HEX."""
        if self.secret is None:
            raise SignatureError(f"--key {self.path}: no key there to sign with")
        return f"hmac-sha256:{self.id}:{hmac.new(self.secret, content, hashlib.sha256).hexdigest()}"

    def check(self, signature: object, content: bytes, where: str) -> None:
        """Refuse, naming `where`, a signature that is not this key's of `content`."""
        form = _FORM.fullmatch(signature) if isinstance(signature, str) else None
        if form is None:
            raise SignatureError(f"{where}: its signature {str(signature)[:80]!r} is not hmac-sha256:ID:HEX, as labkit "
                            "grade writes one")
        if self.secret is None:
            raise SignatureError(f"{where} is signed (key {form[1]}), but there is no key at {self.path}: merge with "
                            "--key FILE, the key the parts' jobs read")
        if form[1] != self.id:
            raise SignatureError(f"{where} was signed with another key (id {form[1]}) than {self.path} (id {self.id}): "
                            "merge with --key FILE, the key the parts' jobs read")
        if not hmac.compare_digest(self.sign(content), signature):
            raise SignatureError(f"{where}: its signature does not match what it holds: edited after it was graded "
                            f"(signed with {self.path}, key {self.id})")


def _make(path: Path) -> bool:
    """Make a key at `path` (mode 0600), unless another process made one first; whether this one did."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
    finally:
        os.close(fd)
    try:
        os.link(draft, path)  # fails where a key is there already: a job that started at once made it
        return True
    except FileExistsError:
        return False
    finally:
        draft.unlink()


def sign_files(out: Path, as_json: bool, key: Key) -> None:
    """Sign the part report.write wrote at `out`: its CSV (a line after the facts) and the JSON beside it, or the
    JSON alone (`as_json`)."""
    twin = out if as_json else out.with_suffix(".json")
    whole = json.loads(twin.read_text(encoding="utf-8"))
    whole["signature"] = key.sign(json_content(whole))
    twin.write_text(json.dumps(whole, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if as_json:
        return
    raw = out.read_bytes()
    lines = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    first = raw.index(b"\n") + 1  # after the facts' line
    out.write_bytes(raw[:first] + (LINE + key.sign(csv_content(lines)) + "\n").encode() + raw[first:])
