"""Every OpenAI parameter of /v1/completions and /v1/chat/completions is supported,
refused with a 400, or ignored on purpose, and docs/serving.md shows that table.

The tables (minillm/serve/openai_params.py) must list exactly the parameters of the
installed official client's create() (openai 3.63: 18 and 37), so a parameter the
client learns to send shows up here first. Each row is then sent to a real server on
the tiny model: its `ok` fields must be answered 200, its `bad` fields refused with a
status and an error that names the parameter. Cost: one tiny server and ~110 short
requests, about 10-20 s.
"""
import inspect
from pathlib import Path

import httpx
import pytest

from minillm.serve.launch import ServerProcess
from minillm.serve.openai_params import CHAT, COMPLETIONS, EXTRAS, TABLES, markdown_table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
BASE = {"/v1/completions": {"prompt": "hi", "max_tokens": 1, "temperature": 0},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}}
ROWS = [(endpoint, p) for endpoint, table in TABLES.items() for p in table] + \
       [("/v1/completions", p) for p in EXTRAS]


def client_parameters(create) -> set[str]:
    transport = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
    return set(inspect.signature(create).parameters) - transport


def test_the_tables_cover_every_parameter_of_the_official_client():
    from openai.resources.chat.completions import Completions as ChatCompletions
    from openai.resources.completions import Completions
    assert {p.name for p in COMPLETIONS} == client_parameters(Completions.create)
    assert {p.name for p in CHAT} == client_parameters(ChatCompletions.create)
    for table in (COMPLETIONS, CHAT, EXTRAS):
        assert len({p.name for p in table}) == len(table), "a parameter listed twice"
        for p in table:
            assert p.ok, f"{p.name}: every row needs a request that shows it (ok)"
            assert p.how != "refused" or p.bad is not None, f"{p.name}: a refused row needs a refused value"


def test_docs_show_the_same_tables():
    text = DOCS.read_text()
    for table in (*TABLES, EXTRAS):
        assert markdown_table(table) in text, "docs/serving.md: regenerate its tables with " \
                                              "minillm.serve.openai_params.markdown_table"


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--model", "tiny"]) as s:
        yield s


def send(server, endpoint, fields):
    body = {**BASE[endpoint], **{k: ("tiny" if v == "MODEL" else v) for k, v in fields.items()}}
    return httpx.post(server.url + endpoint, json=body, timeout=60)


@pytest.mark.parametrize("endpoint, param", ROWS, ids=[f"{e.split('/')[-1]}:{p.name}" for e, p in ROWS])
def test_each_row_does_what_the_table_says(server, endpoint, param):
    ok = send(server, endpoint, param.ok)
    assert ok.status_code == 200, f"{param.name} ({param.how}) with {param.ok}: {ok.text[:300]}"
    if param.bad is not None:
        bad = send(server, endpoint, param.bad)
        assert bad.status_code == param.bad_status, f"{param.name} with {param.bad}: {bad.text[:300]}"
        error = bad.json()["error"]
        assert error["param"].startswith(param.name) and error["code"] == param.bad_status
        assert param.name in error["message"]
