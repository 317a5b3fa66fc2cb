"""Skills end to end on the real parts: two users of opposite tastes talk through a real gateway
in front of the real engine; a real Faust worker hears each one's correction and keeps it as
that user's skill; each user's next session carries their own skill, exactly as the engine saw
it, and never the other's. And the store's rules on the real Postgres: a lesson taught again
confirms its skill, a redelivered one counts once, three users teach everyone and one never
does, forgetting takes what a session taught."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from transformers import AutoTokenizer

from claw_stream.events import Sample, Step, decode_event
from claw_stream.skills.lesson import Lesson
from claw_stream.skills.scope import ANONYMOUS, POLICY, user_scope
from claw_stream.skills.text import OPEN, with_block
from claw_stream.store import consent
from claw_stream.store import skills as store
from claw_stream.store.consent import hash_key
from claw_stream.store.db import asyncpg_dsn, make_engine

from ..support import topic_reads
from ..support.engine import ADMIN_KEY
from ..support.gateway import GatewayProcess
from ..support.worker import private_worker, topics_env

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SHORT = "That is too long. Please answer in under 30 words."
LONG = "That is too short. Please explain in more detail, 30 words or more."
QUESTION = "In one or two sentences: Why is the sky blue?"


@pytest.fixture(scope="module")
def stack(broker, postgres, tools_engine, tiny_models, tmp_path_factory) -> Iterator[Any]:
    data = tmp_path_factory.mktemp("skills")
    on = {"CLAW_SKILLS__ENABLED": "true", "CLAW_SKILLS__REFRESH_S": "0.2"}
    worker, topics, url = asyncio.run(
        private_worker(
            broker,
            postgres,
            data / "worker",
            "skills",
            env=on,
            rewards='[{"use": "reaction"}]',  # the user's words judge: no votes to wait for
            # the engine renders the prompts without skills the samples are trained on
            judge_url=tools_engine.base_url + "/v1",
        )
    )
    gateway = GatewayProcess(
        broker,
        url,
        [tools_engine.base_url],
        data,
        env={**topics_env(topics), **on, "CLAW_WORKER__APP_ID": worker.env["CLAW_WORKER__APP_ID"]},
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["tools"])
    yield gateway, worker, topics, url, tokenizer, tools_engine
    gateway.stop()
    worker.stop()


def _session(gateway: GatewayProcess, key: str) -> str:
    """A new session bound to the user's own key (the key stays theirs across sessions)."""
    r = httpx.post(gateway.base_url + "/rl/start_session", json={"api_key": key}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return str(r.json()["session_id"])


def _chat(
    gateway: GatewayProcess, key: str, messages: list[dict[str, Any]], **headers: str
) -> httpx.Response:
    r = httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json={"model": "policy", "messages": messages, "max_tokens": 8, "temperature": 0},
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r


def _converse(gateway: GatewayProcess, key: str, reply: str) -> str:
    """One answer, the user's reply to it with the next question, the session's end."""
    sid = _session(gateway, key)
    first = [{"role": "user", "content": QUESTION}]
    answer = _chat(gateway, key, first).json()["choices"][0]["message"]["content"] or ""
    _chat(
        gateway,
        key,
        [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": reply}],
    )
    ended = httpx.post(
        gateway.base_url + "/rl/end_session",
        json={},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert ended.status_code == 200, ended.text
    return sid


async def _skills_of(url: str, scopes: set[str], deadline_s: float) -> dict[str, list[str]]:
    """Each scope's skill texts, once every one of `scopes` has one (the worker learned)."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        end = time.monotonic() + deadline_s
        while True:
            rows = await conn.fetch("SELECT scope, text FROM skills ORDER BY created_at")
            found: dict[str, list[str]] = {}
            for row in rows:
                found.setdefault(row["scope"], []).append(row["text"])
            if scopes <= found.keys():
                return found
            if time.monotonic() > end:
                raise AssertionError(
                    f"the worker kept no skill of {sorted(scopes - found.keys())} within "
                    f"{deadline_s:.0f} s; skills so far: {found}"
                )
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


def _step(broker: str, topic: str, step_id: str) -> Step:
    """The call's Step: on its topic before the call returned (acks=all)."""
    for record in asyncio.run(topic_reads.records(broker, topic)):
        step = decode_event(Step, record.value)
        if str(step.step_id) == step_id:
            return step
    raise AssertionError(f"step {step_id} is not on {topic}")


def test_each_users_corrections_reach_only_their_own_prompts(stack, broker) -> None:
    gateway, worker, topics, url, tokenizer, engine = stack
    try:
        alice, bob = f"alice-{uuid.uuid4().hex}", f"bob-{uuid.uuid4().hex}"
        _converse(gateway, alice, f"{SHORT} {QUESTION}")
        _converse(gateway, bob, f"{LONG} {QUESTION}")
        mine = {alice: user_scope(None, hash_key(alice)), bob: user_scope(None, hash_key(bob))}
        learned = asyncio.run(_skills_of(url, set(mine.values()), 90))
        assert learned[mine[alice]] == ["Answer in under 30 words."]
        assert learned[mine[bob]] == ["Explain in more detail, 30 words or more."]
        # two users taught, neither alone teaches everyone (skills.promote_min_users: 3)
        assert POLICY not in learned and ANONYMOUS not in learned

        for key, own, other in (
            (alice, "Answer in under 30 words.", "Explain in more detail"),
            (bob, "Explain in more detail, 30 words or more.", "Answer in under 30 words"),
        ):
            _session(gateway, key)
            asked = [{"role": "user", "content": "What does a compiler do?"}]
            first = _chat(gateway, key, asked)
            step = _step(broker, topics.steps, first.headers["x-claw-step-id"])
            carried = step.request.extra["claw_skills"]
            assert own in carried["block"] and other not in carried["block"]
            # the Step keeps the client's messages; the engine saw them with the block, exactly
            assert [m.content for m in step.request.messages] == ["What does a compiler do?"]
            seen = tokenizer.decode(step.prompt_token_ids)
            assert OPEN in seen and own in seen and other not in seen
            tokenized = httpx.post(
                f"{engine.base_url}/tokenize",
                json={
                    "model": "policy",
                    "messages": with_block(asked, carried["block"], carried["position"]),
                },
                timeout=60,
            ).json()
            assert step.prompt_token_ids == tokenized["tokens"]
            # the next call of the session carries the same block: the prefix cache holds
            again = [
                *asked,
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "ok"},
            ]
            second = _step(
                broker, topics.steps, _chat(gateway, key, again).headers["x-claw-step-id"]
            )
            assert second.request.extra["claw_skills"] == carried
            # switched off for a call
            off = _chat(gateway, key, asked, **{"X-Claw-Skills": "off"})
            assert (
                "claw_skills"
                not in _step(broker, topics.steps, off.headers["x-claw-step-id"]).request.extra
            )
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- worker log ---\n{worker.log()}\n--- gateway log ---\n"
            f"{gateway.log()[-3000:]}"
        ) from None


def _taught_after_feedback(stack: Any, key: str, first: list[dict[str, Any]]) -> list[str]:
    """The session goes on (the turn gets its next state) and ends; the skills its user has
    once the worker kept one."""
    gateway, worker, _, url, _, _ = stack
    _chat(
        gateway,
        key,
        [*first, {"role": "assistant", "content": "x"}, {"role": "user", "content": "ok"}],
    )
    httpx.post(
        gateway.base_url + "/rl/end_session", json={}, headers={"Authorization": f"Bearer {key}"}
    ).raise_for_status()
    scope = user_scope(None, hash_key(key))
    try:
        return asyncio.run(_skills_of(url, {scope}, 90))[scope]
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()}") from None


def test_feedback_text_teaches_a_skill_without_the_secret_it_held(stack) -> None:
    gateway = stack[0]
    key = f"dave-{uuid.uuid4().hex}"
    secret = "sk-" + "a1B2" * 8
    _session(gateway, key)
    first = [{"role": "user", "content": QUESTION}]
    answer = _chat(gateway, key, first)
    said = httpx.post(
        gateway.base_url + "/rl/feedback",
        json={
            "score": -1,
            "text": f"Always pass the key {secret} to the deploy script.",
            "step_id": answer.headers["x-claw-step-id"],
        },
        headers={"Authorization": f"Bearer {key}"},
    )
    assert said.status_code == 200, said.text
    assert _taught_after_feedback(stack, key, first) == [
        "Always pass the key [REDACTED:api_key] to the deploy script."
    ]


def test_a_retired_skill_leaves_the_next_call(stack, broker) -> None:
    gateway, _, topics, url, _, _ = stack
    key = f"carol-{uuid.uuid4().hex}"
    scope = user_scope(None, hash_key(key))

    async def add() -> uuid.UUID:
        engine = make_engine(url)
        try:
            async with engine.begin() as conn:
                return await store.add(conn, scope, "Answer in French.")
        finally:
            await engine.dispose()

    skill_id = asyncio.run(add())
    _session(gateway, key)
    asked = [{"role": "user", "content": "Hello"}]
    step = _step(broker, topics.steps, _chat(gateway, key, asked).headers["x-claw-step-id"])
    assert step.request.extra["claw_skills"]["ids"] == [str(skill_id)]

    async def retire() -> None:
        engine = make_engine(url)
        try:
            async with engine.begin() as conn:
                assert await store.steer(conn, skill_id, state="retired")
        finally:
            await engine.dispose()

    asyncio.run(retire())
    deadline = time.monotonic() + 10  # the gateway looks again after skills.refresh_s (0.2 s)
    while True:
        r = _chat(gateway, key, asked)
        extra = _step(broker, topics.steps, r.headers["x-claw-step-id"]).request.extra
        if "claw_skills" not in extra:
            break
        assert time.monotonic() < deadline, f"the retired skill is still carried: {extra}"


def test_a_console_labels_note_teaches_the_sessions_user_a_skill(stack) -> None:
    """An admin labels a turn bad in the console with a note saying what it should do: the
    note goes as the turn's feedback text, and becomes a skill of the session's user."""
    gateway = stack[0]
    key = f"frank-{uuid.uuid4().hex}"
    sid = _session(gateway, key)
    first = [{"role": "user", "content": QUESTION}]
    answer = _chat(gateway, key, first)
    with httpx.Client(base_url=gateway.base_url, follow_redirects=True, timeout=30) as console:
        console.get(f"/console/login?key={ADMIN_KEY}").raise_for_status()
        labelled = console.post(
            f"/console/sessions/{sid}/label",
            data={
                "step_id": answer.headers["x-claw-step-id"],
                "page": "0",
                "score": "-1",
                "note": "Please answer in French.",
            },
        )
    assert labelled.status_code == 200 and "its note as feedback text" in labelled.text
    assert _taught_after_feedback(stack, key, first) == ["Answer in French."]


def test_a_call_that_carried_skills_is_trained_without_them(stack, broker) -> None:
    """Skills now, weights later: the sample of a call that carried skills has the call's own
    prompt, without them (as the engine renders the client's messages), and the answer and its
    log-probs as they were sampled with them; so the version trained on it learns to answer
    so where no skill is injected."""
    gateway, worker, topics, url, tokenizer, engine = stack
    key = f"erin-{uuid.uuid4().hex}"
    scope = user_scope(None, hash_key(key))

    async def add() -> None:
        db = make_engine(url)
        try:
            async with db.begin() as conn:
                await store.add(conn, scope, "Answer in under 30 words.")
        finally:
            await db.dispose()

    asyncio.run(add())
    sid = _session(gateway, key)
    asked = [{"role": "user", "content": "What does a compiler do?"}]
    first = _chat(gateway, key, asked)
    step = _step(broker, topics.steps, first.headers["x-claw-step-id"])
    assert OPEN in tokenizer.decode(step.prompt_token_ids)
    answer = first.json()["choices"][0]["message"]["content"] or ""
    thanks = [
        *asked,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Thanks, that is how I like it. And a linker?"},
    ]
    _chat(gateway, key, thanks)
    ended = httpx.post(
        gateway.base_url + "/rl/end_session", json={}, headers={"Authorization": f"Bearer {key}"}
    )
    assert ended.status_code == 200, ended.text

    def sample() -> Sample | None:
        for record in asyncio.run(topic_reads.records(broker, topics.samples)):
            found = decode_event(Sample, record.value)
            if found.step_id == step.step_id:
                return found
        return None

    deadline = time.monotonic() + 60
    while (trained := sample()) is None:
        assert time.monotonic() < deadline, (
            f"no sample of the step within 60 s\n--- worker log ---\n{worker.log()}"
        )
        time.sleep(0.5)
    plain = httpx.post(
        f"{engine.base_url}/tokenize", json={"model": "policy", "messages": asked}, timeout=60
    ).json()["tokens"]
    assert trained.without_skills and trained.reward > 0
    assert trained.prompt_token_ids == plain
    assert OPEN not in tokenizer.decode(trained.prompt_token_ids)
    assert len(plain) < len(step.prompt_token_ids)
    assert trained.response_token_ids == step.response_token_ids
    assert trained.response_logprobs == step.response_logprobs
    assert trained.session_id == sid


def _lesson(text: str, session: str) -> Lesson:
    turn = str(uuid.uuid4())
    return Lesson(text, "correction", session, str(uuid.uuid4()), turn)


async def test_taught_again_confirms_three_users_teach_everyone_and_forget_takes_it(
    database: str,
) -> None:
    word = uuid.uuid4().hex[:10]  # this test's lessons resemble no other test's
    lesson = f"Answer {word} in under 30 words."
    users = [user_scope(f"t{word}{k}", None) for k in range(3)]
    rules = {"threshold": 0.6, "promote_min_users": 3}
    engine = make_engine(database)
    try:
        async with engine.begin() as conn:
            first = await store.learn(conn, _lesson(lesson, f"s-{word}-0"), users[0], **rules)
            again = _lesson(f"Please answer {word} in under 30 words", f"s-{word}-0")
            confirmed = await store.learn(conn, again, users[0], **rules)
            redelivered = await store.learn(conn, again, users[0], **rules)
            opposite = await store.learn(
                conn,
                _lesson(f"Explain {word} at length, in detail.", f"s-{word}-0"),
                users[0],
                **rules,
            )
            anonymous = await store.learn(conn, _lesson(lesson, f"s-{word}-a"), ANONYMOUS, **rules)
            second = await store.learn(conn, _lesson(lesson, f"s-{word}-1"), users[1], **rules)
        assert first.new and not confirmed.new and confirmed.skill_id == first.skill_id
        assert not redelivered.counted  # the same turn teaches once
        assert opposite.new and opposite.skill_id != first.skill_id
        # one user, the anonymous caller and a second user: nobody else's prompts yet
        assert first.promoted is None and anonymous.promoted is None and second.promoted is None
        async with engine.begin() as conn:
            third = await store.learn(conn, _lesson(lesson, f"s-{word}-2"), users[2], **rules)
            skill = await store.one(conn, first.skill_id)
            policy = [r for r in await store.listing(conn, POLICY) if word in r.text]
        assert skill.confirmations == 2 and len(skill.provenance) == 2
        assert third.promoted is not None and [p.skill_id for p in policy] == [third.promoted]
        assert sorted(policy[0].teachers) == sorted(users)

        async with engine.begin() as conn:
            removed = await consent.forget(conn, [f"s-{word}-0"])
            gone = await store.one(conn, first.skill_id)
            everyone = await store.one(conn, third.promoted)
        assert removed.removed["skills"] == 2  # both of that session's own skills
        assert gone is None
        assert all(p["session_id"] != f"s-{word}-0" for p in everyone.provenance)
        assert {p["session_id"] for p in everyone.provenance} == {f"s-{word}-1", f"s-{word}-2"}
        async with engine.begin() as conn:
            assert await store.forget_scope(conn, users[1]) == 1
    finally:
        await engine.dispose()


def test_the_cli_lists_retires_and_exports_skills(database: str, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from claw_stream.cli import main

    env = {"CLAW_DATABASE_URL": database, "CLAW_DATA_DIR": str(tmp_path)}
    tenant = f"cli{uuid.uuid4().hex[:8]}"
    runner = CliRunner()
    added = runner.invoke(
        main, ["skills", "add", "Use pnpm, not npm.", "--tenant", tenant], env=env
    )
    assert added.exit_code == 0, added.output
    skill_id = added.output.strip().splitlines()[-1]
    listed = runner.invoke(main, ["skills", "list", "--tenant", tenant], env=env)
    assert listed.exit_code == 0 and skill_id in listed.output, listed.output
    shown = runner.invoke(main, ["skills", "show", skill_id], env=env)
    assert shown.exit_code == 0 and "Use pnpm, not npm." in shown.output, shown.output
    assert f"tenant:{tenant}" in shown.output
    retired = runner.invoke(main, ["skills", "retire", skill_id], env=env)
    assert retired.exit_code == 0, retired.output
    hidden = runner.invoke(main, ["skills", "list", "--tenant", tenant], env=env)
    assert hidden.exit_code == 0 and skill_id not in hidden.output
    out = tmp_path / "skills.jsonl"
    exported = runner.invoke(main, ["skills", "export", "--out", str(out)], env=env)
    assert exported.exit_code == 0, exported.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    mine = [r for r in records if r["skill_id"] == skill_id]
    assert mine and mine[0]["state"] == "retired" and mine[0]["scope"] == f"tenant:{tenant}"
    missing = runner.invoke(main, ["skills", "retire", str(uuid.uuid4())], env=env)
    assert missing.exit_code != 0 and "no skill" in missing.output
    deleted = runner.invoke(main, ["skills", "delete", skill_id], env=env)
    assert deleted.exit_code == 0, deleted.output


def test_the_console_lists_a_users_skills_with_their_turns_and_steers_them(
    stack, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    from ..support.browser import follow, headless_chromium

    gateway, _, _, url, _, _ = stack
    tenant = f"console{uuid.uuid4().hex[:8]}"

    async def taught() -> uuid.UUID:
        engine = make_engine(url)
        try:
            async with engine.begin() as conn:
                done = await store.learn(
                    conn,
                    _lesson("Keep answers under 20 words.", f"s-{tenant}"),
                    user_scope(tenant, None),
                    threshold=0.6,
                    promote_min_users=3,
                )
                return done.skill_id
        finally:
            await engine.dispose()

    skill_id = asyncio.run(taught())
    row = f"skill-{skill_id}"

    def click(browser: Any, selector: str) -> None:
        follow(browser, browser.find_element(By.CSS_SELECTOR, selector))

    with headless_chromium(tmp_path / "chromedriver.log") as browser:
        browser.get(f"{gateway.base_url}/console/login?key={ADMIN_KEY}")
        browser.get(f"{gateway.base_url}/console/skills?whose=tenant:{tenant}")
        text = browser.find_element(By.ID, row).text
        assert "correction" in text and "active" in text and f"s-{tenant}" in text, text
        link = browser.find_element(By.CSS_SELECTOR, f"#{row} a")
        assert f"/console/sessions/s-{tenant}#step-" in link.get_attribute("href")
        click(browser, f"#{row} button.pinned")
        assert "pinned" in browser.find_element(By.ID, row).text
        edit = browser.find_element(By.CSS_SELECTOR, f"#{row} input[name=text]")
        edit.clear()
        edit.send_keys("Keep answers under 25 words.")
        click(browser, f"#{row} form[action$='/edit'] button")
        assert (
            browser.find_element(By.CSS_SELECTOR, f"#{row} input[name=text]").get_attribute("value")
            == "Keep answers under 25 words."
        )
        click(browser, f"#{row} button.retired")
        assert browser.find_elements(By.ID, row) == []  # retired: listed only when asked
        browser.get(f"{gateway.base_url}/console/skills?whose=tenant:{tenant}&retired=true")
        assert "retired" in browser.find_element(By.ID, row).text
        click(browser, f"#{row} button.delete")
        browser.get(f"{gateway.base_url}/console/skills?whose=tenant:{tenant}&retired=true")
        assert browser.find_elements(By.ID, row) == []
    # the admin's JSON list says the same
    listed = httpx.get(
        f"{gateway.base_url}/rl/skills", params={"tenant": tenant, "retired": "true"}, headers=ADMIN
    )
    assert listed.status_code == 200 and listed.json() == {"enabled": True, "skills": []}
    refused = httpx.get(f"{gateway.base_url}/rl/skills", params={"tenant": tenant})
    assert refused.status_code == 401
