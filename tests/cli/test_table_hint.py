"""The analyze table shows a few of the metrics it computed; a line under it says how many and where the others
are. Nothing is hinted at when every computed metric is shown."""

from __future__ import annotations

import json
import re


def hint(stdout: str) -> re.Match | None:
    return re.search(r"(\d+) of (\d+) computed metrics shown; (.*) every one, JSON and CSV keep them all",
                     " ".join(stdout.split()))


def test_the_default_table_says_where_the_other_metrics_are(cli, tiny_bert):
    r = cli("analyze", tiny_bert, "--format", "table", env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.stderr
    m = hint(r.stdout)
    assert m and m.group(3) == "--metrics all shows"
    computed = json.loads(cli("analyze", tiny_bert, "--format", "json").stdout)
    names = computed["processing"]["metrics"]
    shown_headers = r.stdout.split("columns: ")[1]
    assert int(m.group(2)) == len(names) and int(m.group(1)) == shown_headers.count("=") < len(names)


def test_no_hint_when_everything_is_shown(cli, tiny_bert):
    r = cli("analyze", tiny_bert, "--format", "table", "--metrics", "all", env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.stderr
    assert hint(r.stdout) is None and "computed metrics shown" not in r.stdout


def test_by_layer_points_to_the_head_rows(cli, tiny_bert):
    r = cli("analyze", tiny_bert, "--format", "table", "--by", "layer", env={"COLUMNS": "100"})
    m = hint(r.stdout)
    assert m and m.group(3) == "--by head --metrics all shows"
