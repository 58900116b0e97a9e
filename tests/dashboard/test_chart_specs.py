"""Every chart the pages draw is a valid Vega-Lite spec. A served page skips Altair's own check of each spec
(`dashboard.views.charts.show`: a tenth of a render), so the check is made here, on every page of a fleet's store:
each spec Streamlit hands the browser, against the Vega-Lite schema Altair ships."""

from __future__ import annotations

import pytest
from altair.utils.schemapi import validate_jsonschema
from altair.vegalite.v6.schema import core

from dashboard.views import PAGES
from tests.dashboard.test_app import assert_clean, charts, open_page

SCHEMA = core.load_schema()


def drawn(monkeypatch, url: str, page: str) -> list[dict]:
    at = open_page(monkeypatch, url, page)
    assert_clean(at)
    if page == "whatif":  # its chart comes with a replay
        at.button(key="whatif_go").click().run()
        assert_clean(at)
    return charts(at)


@pytest.mark.parametrize("page", list(PAGES))
def test_every_chart_of_every_page_is_a_valid_vega_lite_spec(monkeypatch, fleet_run, page):
    specs = drawn(monkeypatch, fleet_run.url, page)
    if page != "alerts":  # the recorded fleet run raised no alert: the page draws no chart
        assert specs, f"{page} drew no chart"
    for spec in specs:
        validate_jsonschema(spec, SCHEMA, rootschema=SCHEMA)  # raises on the first error, naming it


def test_an_invalid_spec_is_caught():
    """The check above can fail: a mark Vega-Lite does not have is refused."""
    spec = {"data": {"name": "d"}, "mark": {"type": "lines"}, "encoding": {"x": {"field": "a", "type": "quantitative"}}}
    with pytest.raises(Exception, match="expected"):
        validate_jsonschema(spec, SCHEMA, rootschema=SCHEMA)
