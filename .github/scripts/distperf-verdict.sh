#!/usr/bin/env bash
# The verdict of distperf-gate.yml: completes the required check run "distperf gate" on the tested commit and
# posts or updates the pull request's one comment. Success only when the plugin tests passed (the run of
# .github/workflows/distperf.yml that triggered the gate) and the GPU gate ran and passed; anything else
# (skipped, cancelled, rejected, failed, a run of another workflow file, a fork pull request that changes
# .github/) is a failure, and this script then exits 1 too.
#
# Environment (set by the workflow): CHECK_TOKEN (GitHub App: checks), COMMENT_TOKEN (GITHUB_TOKEN: pull requests),
# CHECK_ID (may be empty), CHECK_NAME, REPO, EVENT, HEAD_SHA, HEAD_REPO, WORKFLOW_PATH, PLUGIN_TESTS,
# PLUGIN_TESTS_URL, GATE, RUN_URL, REPORT (the plugin's --distperf-pr-comment file; may be missing).
set -euo pipefail

MARKER="<!-- distperf-gate -->"
EXPECTED_WORKFLOW=.github/workflows/distperf.yml
MAX_BODY=60000  # GitHub refuses comment bodies and check summaries over 65535 characters
MAX_REPORT=20000  # bytes of the fork-produced report in the bot's comment (sanitize-comment.sh caps and strips it)
here=$(dirname "$0")

as_checks() { GH_TOKEN="$CHECK_TOKEN" gh "$@"; }
as_actions() { GH_TOKEN="$COMMENT_TOKEN" gh "$@"; }

# The open pull request whose head is the tested commit (workflow_run lists none for a fork's pull request).
find_pull_request() {
  local number
  for number in $(as_actions pr list --repo "$REPO" --state open --search "$HEAD_SHA" --json number --jq '.[].number'); do
    if [ "$(as_actions api "repos/$REPO/pulls/$number" --jq .head.sha)" = "$HEAD_SHA" ]; then
      echo "$number"
      return
    fi
  done
}

reasons=()
[ "$WORKFLOW_PATH" = "$EXPECTED_WORKFLOW" ] \
  || reasons+=("the triggering run came from \`$WORKFLOW_PATH\`, not \`$EXPECTED_WORKFLOW\`")
[ "$PLUGIN_TESTS" = success ] || reasons+=("the plugin tests (distperf.yml): $PLUGIN_TESTS ($PLUGIN_TESTS_URL)")
case "$GATE" in
  success) ;;
  skipped) reasons+=("the GPU gate did not run") ;;
  *) reasons+=("the GPU gate: $GATE ($RUN_URL)") ;;
esac

pull_request=""
if [ "$EVENT" = pull_request ]; then
  pull_request=$(find_pull_request)
  if [ "$HEAD_REPO" != "$REPO" ]; then
    if [ -z "$pull_request" ]; then
      reasons+=("no open pull request has head $HEAD_SHA, so what it changes cannot be checked")
    else
      workflow_files=$(as_actions api --paginate "repos/$REPO/pulls/$pull_request/files" \
        --jq '.[] | .filename, (.previous_filename // empty)' | grep -E '^\.github/' | sort -u | paste -sd ' ' - || true)
      [ -z "$workflow_files" ] || reasons+=("a fork pull request changes .github/ ($workflow_files): a maintainer re-lands such a change from a branch of this repository")
    fi
  fi
fi

short=${HEAD_SHA:0:12}
if [ ${#reasons[@]} -eq 0 ]; then
  conclusion=success
  title="passed: plugin tests and the GPU perf gate at $short"
else
  conclusion=failure
  title="failed at $short: ${reasons[0]}"
fi
title=${title:0:250}

summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
{
  echo "$MARKER"
  if [ "$conclusion" = success ]; then
    echo "### distperf gate: ✓ passed at \`$short\`"
  else
    echo "### distperf gate: ✗ failed at \`$short\`"
    for reason in "${reasons[@]}"; do echo "- $reason"; done
  fi
  echo
  echo "Plugin tests: $PLUGIN_TESTS_URL · GPU gate: $RUN_URL (reports, and on failure the job folders, are artifacts of that run)"
  echo
  if [ -s "$REPORT" ]; then
    # The report is written by the tested (possibly a fork's) code: no HTML, no @mentions, at most MAX_REPORT bytes
    bash "$here/sanitize-comment.sh" "$REPORT" "$MAX_REPORT"
  else
    echo "_No perf report: the GPU gate did not produce one._"
  fi
} | head -c "$MAX_BODY" > "$summary"

if [ -n "$CHECK_ID" ]; then
  as_checks api -X PATCH "repos/$REPO/check-runs/$CHECK_ID" -f status=completed -f conclusion="$conclusion" \
    -f details_url="$RUN_URL" -f "output[title]=$title" -F "output[summary]=@$summary" --silent
else  # opening it failed: create it completed
  as_checks api "repos/$REPO/check-runs" -f name="$CHECK_NAME" -f head_sha="$HEAD_SHA" -f status=completed \
    -f conclusion="$conclusion" -f details_url="$RUN_URL" -f "output[title]=$title" \
    -F "output[summary]=@$summary" --silent
fi
echo "distperf gate: $conclusion — $title"

if [ -n "$pull_request" ]; then
  existing=$(as_actions api --paginate "repos/$REPO/issues/$pull_request/comments" \
    --jq ".[] | select(.user.login == \"github-actions[bot]\" and (.body | startswith(\"$MARKER\"))) | .id" | head -n 1)
  if [ -n "$existing" ]; then
    as_actions api -X PATCH "repos/$REPO/issues/comments/$existing" -F "body=@$summary" --silent
  else
    as_actions api "repos/$REPO/issues/$pull_request/comments" -F "body=@$summary" --silent
  fi
fi

[ "$conclusion" = success ]
