"""Stage splits read as ranges: a deep pipeline's split leads with its stage count and sizes, and in
the HTML diff a range ("71–72") never breaks across lines (it broke at the dash)."""
from autopar.report.analysis import stage_ranges_text
from autopar.report.render import keep_ranges_whole


def test_many_stages_lead_with_their_count_and_sizes():
    stages = [[0, 5]] + [[5 + 4 * i, 9 + 4 * i] for i in range(23)]     # 24 stages over 97 rows
    text = stage_ranges_text(stages)
    assert text.startswith("24 stages of 4–5 rows: 0–4 | 5–8 | ")
    assert text.endswith("| 93–96")
    assert stage_ranges_text([[0, 4], [4, 8], [8, 12], [12, 16], [16, 20]]).startswith("5 stages of 4 rows: ")
    assert stage_ranges_text([[0, 50], [50, 98]]) == "rows 0–49 | 50–97"      # few: as before


def test_html_diff_keeps_each_range_on_one_line():
    row = ("stages", "rows 0–49 | 50–97", "rows 0–39 | 40–97", "")
    cells = keep_ranges_whole(row)
    assert cells[1] == "rows 0\u2060–\u206049 | 50\u2060–\u206097"
    assert cells[1].replace("\u2060", "") == row[1]           # the same text, copied
    assert keep_ranges_whole(("step time", "1–2", "x", "")) == ("step time", "1–2", "x", "")
