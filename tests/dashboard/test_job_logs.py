"""The job page's output: each task's tail, an attempt picker (htmx fragment, or a plain GET
without JavaScript), only the latest attempt's pane followed live, and a download link."""

from __future__ import annotations

import re

import pytest

from scheduler.models import Task, TaskLog
from tests.factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def retried(owner) -> Task:
    task = make_job(owner).tasks.get()
    Task.objects.filter(pk=task.pk).update(attempt=1)
    TaskLog.objects.create(task=task, attempt=0, offset=0, data="first try\n")
    TaskLog.objects.create(task=task, attempt=1, offset=0, data="second try\n")
    task.refresh_from_db()
    return task


def selected(html: str) -> list[str]:
    return re.findall(r'<option value="(\d+)" selected>', html)


def test_the_page_shows_the_latest_attempt_live_with_a_picker_and_a_download(
    owner, signed_in, retried
):
    html = signed_in(owner).get(f"/jobs/{retried.job_id}/").content.decode()
    live = f'id="job-{retried.job_id}-log-{retried.pk}"'  # where pushes append
    assert live in html and "second try\n" in html and "first try" not in html
    assert selected(html) == ["1"] and '<option value="0">0</option>' in html
    download = f"/api/v1/jobs/{retried.job_id}/tasks/{retried.pk}/log/?attempt=1"
    assert f'href="{download}" download' in html


def test_picking_an_earlier_attempt_shows_it_and_stops_following(owner, signed_in, retried):
    path = f"/jobs/{retried.job_id}/tasks/{retried.pk}/log/?attempt=0"
    html = signed_in(owner).get(path, HTTP_HX_REQUEST="true").content.decode()
    assert "first try\n" in html and "second try" not in html
    assert f'id="job-{retried.job_id}-log-{retried.pk}-attempt-0"' in html  # pushes miss it
    assert "aria-live" not in html and selected(html) == ["0"]
    assert f"/tasks/{retried.pk}/log/?attempt=0" in html  # its own download


def test_without_javascript_the_picker_is_a_get_of_the_page(owner, signed_in, retried):
    page = f"/jobs/{retried.job_id}/?task={retried.pk}&attempt=0"
    html = signed_in(owner).get(page).content.decode()
    assert "first try\n" in html and selected(html) == ["0"]


@pytest.mark.parametrize("attempt", ["2", "x", "-1", "9" * 40])
def test_an_attempt_the_task_never_had_is_404(owner, signed_in, retried, attempt):
    client = signed_in(owner)
    path = f"/jobs/{retried.job_id}/tasks/{retried.pk}/log/?attempt={attempt}"
    assert client.get(path).status_code == 404
    assert client.get(f"/jobs/{retried.job_id}/?task={retried.pk}&attempt={attempt}"
                      ).status_code == 404  # fmt: skip


@pytest.mark.parametrize("who", ["teammate", "outsider"])
def test_another_users_task_output_is_404(request, signed_in, retried, who):
    client = signed_in(request.getfixturevalue(who))
    path = f"/jobs/{retried.job_id}/tasks/{retried.pk}/log/?attempt=0"
    response = client.get(path)
    assert response.status_code == 404 and b"first try" not in response.content


def test_a_long_log_shows_its_last_20000_characters_and_says_so(owner, signed_in):
    task = make_job(owner).tasks.get()
    text = "".join(f"line {i:06d}\n" for i in range(5000))  # 60,000 characters
    for at in range(0, len(text), 6000):
        TaskLog.objects.create(task=task, attempt=0, offset=at, data=text[at : at + 6000])
    html = signed_in(owner).get(f"/jobs/{task.job_id}/").content.decode()
    pane = re.search(r'<pre class="log"[^>]*>(.*?)</pre>', html, re.S)
    assert pane is not None and pane.group(1) == text[-20000:]
    assert "the last 20000 characters" in html and "download full output" in html
