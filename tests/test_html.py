"""The interactive explorer (``cutetma swizzle html``): one self-contained page whose tables
come from the model, driven in headless Chromium like a reader would: hover a source cell,
read back which destination cell lights up; flip the toggles and watch the answer change.

The browser tests need Debian's ``chromium`` and the ``playwright`` package (no browser
download: Playwright drives the system Chromium); without them they are skipped, saying so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cutetma import swizzle as hw
from cutetma.cli import main
from cutetma.viz import html

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def page_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html") / "tma.html"
    assert main(["swizzle", "html", "--out", str(out)]) == 0
    return out


def _figure(fid: str) -> dict:
    return next(f for f in html.explorer_data()["figures"] if f["id"] == fid)


# --------------------------------------------------------------------------- no browser
def test_page_is_self_contained(page_file):
    text = page_file.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<(link|img|iframe)\b", text, re.I)
    assert not re.search(r"\b(src|href)\s*=", text, re.I), "the page loads something"
    assert not re.search(r"url\(|@import|fetch\(|XMLHttpRequest", text)
    assert len(text.encode()) < 1_000_000


def test_intro_tables_are_the_models():
    fig = _figure("intro")
    rows, sectors = hw.sector_map(8, 64, 2, "128B")
    src = fig["combos"]["128B"]["src"]["cells"]
    for r in range(8):
        for c in range(8):
            _, _, block, line, sector, *_ = src[r][c]
            assert (block, line, sector) == (0, rows[r, c], sectors[r, c]) == (0, r, c ^ r)
    assert src[3][5][2:5] == [0, 3, 6]
    assert fig["combos"]["none"]["src"]["cells"][3][5][2:5] == [0, 3, 5]


def test_bank_tables_are_the_models():
    fig = _figure("banks")
    for key, grouped in (("128B|yes", True), ("128B|no", False)):
        sel = fig["combos"][key]["selections"]
        for col in range(16):
            # rows 8-15: the 16-row tile column_access_banks assumes for these rows
            report = hw.column_access_banks(256, col, range(8, 16), "128B", grouped=grouped)
            assert sel[col][8]["banks"] == list(report.bank_sectors)
        chapter = hw.column_access_banks(256, 0, range(8), "128B", grouped=grouped)
        assert sel[0][0]["banks"] == list(chapter.bank_sectors)
        assert sel[0][0]["distinct"] == (8 if grouped else 4)


def test_dtype_only_relabels():
    # the generator asserts this while building; here the labels themselves differ
    labels = _figure("intro")["labels"]
    assert labels["fp16"]["cols"][5] == "40\u201347"
    assert labels["fp8"]["cols"][5] == "80\u201395"
    assert labels["fp32"]["cols"][5] == "20\u201323"


# --------------------------------------------------------------------------- browser
@pytest.fixture(scope="module")
def page(page_file):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is not installed (pip install "
        "playwright; no `playwright install`: it drives /usr/bin/chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            errors = []
            pg.on("pageerror", lambda exc: errors.append(str(exc)))
            pg.set_default_timeout(10_000)
            pg.goto(page_file.as_uri())
            pg.wait_for_selector("body[data-ready='1']")
            pg.errors = errors
            yield pg
        finally:
            browser.close()


def _hover(page, fid, r, c):
    page.hover(f'#{fid}-src .cell[data-r="{r}"][data-c="{c}"]')


def _lit(page, fid):
    """(block, row, column) of each highlighted destination cell."""
    cells = page.query_selector_all(f"#{fid}-dst .cell.hl")
    return [(int(e.get_attribute("data-b")), int(e.get_attribute("data-r")),
             int(e.get_attribute("data-c"))) for e in cells]


def _choose(page, fid, name, value):
    page.click(f'label[for="{fid}-{name}-{value}"]')


def test_hover_128b_row3_sector5_lands_in_sector_6(page):
    _choose(page, "intro", "mode", "128B")
    _choose(page, "intro", "dtype", "fp16")
    _hover(page, "intro", 3, 5)
    assert _lit(page, "intro") == [(0, 3, 6)]
    info = page.inner_text("#intro .info")
    assert "row 3, sector 6" in info and "fp16 elements 40\u201347" in info
    assert not page.errors


def test_mode_none_keeps_sector_5(page):
    _choose(page, "intro", "mode", "none")
    _hover(page, "intro", 3, 5)
    assert _lit(page, "intro") == [(0, 3, 5)]
    _choose(page, "intro", "mode", "128B")


def test_hover_destination_shows_its_source(page):
    _choose(page, "intro", "mode", "128B")
    page.hover('#intro-dst .cell[data-r="3"][data-c="6"]')
    lit = page.query_selector_all("#intro-src .cell.hl")
    assert [(e.get_attribute("data-r"), e.get_attribute("data-c")) for e in lit] == [("3", "5")]


def test_3d_figure_follows_the_column_offset(page):
    _choose(page, "grouped", "mode", "128B")
    _choose(page, "grouped", "offset", "0")
    _hover(page, "grouped", 9, 27)  # right half of the tensor: outside the slice
    assert _lit(page, "grouped") == []
    _choose(page, "grouped", "offset", "1")
    _hover(page, "grouped", 9, 27)  # slice sector 11 = g1, local sector 3, row 9 -> 3 ^ 1
    assert _lit(page, "grouped") == [(1, 9, 2)]
    _hover(page, "grouped", 0, 16)  # the slice's first sector -> g0 row 0 sector 0
    assert _lit(page, "grouped") == [(0, 0, 0)]
    assert "128\u2013255" in page.inner_text('label[for="grouped-offset-1"]')


def test_bank_figure_grouped_vs_ungrouped(page):
    _choose(page, "banks", "mode", "128B")
    page.select_option("#banks-column", "0")
    page.select_option("#banks-start", "0")

    def verdict():
        v = page.query_selector("#banks .verdict")
        used = page.query_selector_all("#banks .bank:not([data-count='0'])")
        reads = page.query_selector_all("#banks-dst .cell.acc")
        return int(v.get_attribute("data-distinct")), len(used), len(reads)

    _choose(page, "banks", "tiling", "yes")
    assert verdict() == (8, 8, 8)
    _choose(page, "banks", "tiling", "no")
    assert verdict() == (4, 4, 8)
    assert "2-way bank conflict" in page.inner_text("#banks .verdict")
    page.click('#banks-src .cell[data-r="3"][data-c="9"]')  # click selects column 9, rows 3-10
    assert page.input_value("#banks-column") == "9" and page.input_value("#banks-start") == "3"
    assert not page.errors
