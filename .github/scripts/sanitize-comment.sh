#!/usr/bin/env bash
# Print a fork-produced Markdown file (the gate's pr-comment.md: written by the pull request's own code) fit to be
# posted as the bot's comment: HTML comments and tags removed (no hidden text, no fake "<!-- distperf-gate -->"
# marker, no images or details blocks that hide content), @mentions and #-references to teams defused (a zero-width
# space after the @, so nobody is pinged by a fork), and the whole capped at MAX_BYTES (default 20000) bytes on a
# UTF-8 character boundary, with a line saying it was cut.
#
#   bash .github/scripts/sanitize-comment.sh FILE [MAX_BYTES]
set -euo pipefail

python3 - "$1" "${2:-20000}" <<'PY'
import re
import sys

path, limit = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    text = f.read(4 * limit).decode("utf-8", errors="replace")  # never more than the cap needs
text = re.sub(r"<!--.*?(-->|$)", "", text, flags=re.S)  # comments, also an unterminated one
text = re.sub(r"</?[A-Za-z][^>]*>?", "", text)  # tags (and a tag cut off at the end)
text = text.replace("<", "&lt;")  # whatever is left cannot open markup
text = re.sub(r"(?<![\w`])@(?=[A-Za-z0-9])", "@\u200b", text)  # @user, @org/team
note = "\n\n_(cut: the report was longer than the comment allows)_\n"
data = text.encode("utf-8")
if len(data) > limit:
    data = data[:limit - len(note.encode())].decode("utf-8", errors="ignore").encode("utf-8") + note.encode()
sys.stdout.write(data.decode("utf-8"))
PY
