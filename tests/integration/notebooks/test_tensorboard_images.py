"""The images a job writes to TensorBoard event files, listed with their step and served byte for byte, on a real
server: the job writes them with TensorBoard's own EventFileWriter under $KILN_TENSORBOARD_DIR (torch's
add_image form at the top, TF2's tf.summary.image form in a subdirectory), the server copies the files into the
store when the attempt ends (EventSync's copy), and GET /jobs/{id}/tensorboard-images lists them. Another
organisation gets 404 for both routes; and the console's job page shows them (Chromium)."""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kiln.domain.schemas import TensorBoardImageList
from kiln.errors import BadRequest, InvalidInput, NotFound
from kiln.sdk.client import Client
from tests.helpers import wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant
from tests.tensorboard_events import png

PNGS = [png(3, 2, (255, 0, 0)), png(3, 2, (0, 255, 0)), png(3, 2, (0, 0, 255))]
PRED = [png(4, 4, (9, 9, 9)), png(4, 4, (200, 100, 0))]

JOB = f"""
import os
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.image import metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
PNGS = [bytes.fromhex(h) for h in {[p.hex() for p in PNGS]!r}]
PRED = [bytes.fromhex(h) for h in {[p.hex() for p in PRED]!r}]
root = os.environ["KILN_TENSORBOARD_DIR"]
writer = EventFileWriter(root)
def event(step, value):
    return event_pb2.Event(wall_time=1_800_000_000 + step, step=step, summary=summary_pb2.Summary(value=[value]))
for step, data in zip((0, 5, 10), PNGS):  # torch's SummaryWriter.add_image
    image = summary_pb2.Summary.Image(height=2, width=3, colorspace=3, encoded_image_string=data)
    value = summary_pb2.Summary.Value(tag="samples", image=image)
    writer.add_event(event(step, value))
    writer.add_event(event(step, summary_pb2.Summary.Value(tag="loss", simple_value=1 / (step + 1))))
writer.close()
writer = EventFileWriter(os.path.join(root, "eval"))
for step, images in ((1, PRED), (2, PRED[:1])):  # TF2's tf.summary.image: metadata on the first event only
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"4", b"4", *images])
    value = summary_pb2.Summary.Value(tag="pred", tensor=tensor)
    if step == 1:
        value.metadata.CopyFrom(metadata.create_summary_metadata(display_name="pred", description=""))
    writer.add_event(event(step, value))
writer.close()
"""


@dataclass
class Written:
    job_id: str
    owner: Tenant
    other: Tenant


@pytest.fixture(scope="module")
def written(shared_server: KilnServer) -> Iterator[Written]:
    """One job of one organisation that wrote the images (another organisation alongside)."""
    admin = Api.admin(shared_server)
    tag = uuid.uuid4().hex[:6]
    owner, other = (
        create_tenant(admin, f"tbimg-{tag}", ("member",)),
        create_tenant(admin, f"tbother-{tag}", ("member",)),
    )
    kiln = _client(shared_server, owner)
    job = kiln.submit({"command": [sys.executable, "-c", JOB], "runtime": {"python": sys.executable}})
    done = wait_for(kiln, job.id, timeout=120)
    assert done.state == "SUCCEEDED", done.message
    kiln.close()
    yield Written(job.id, owner, other)
    close_all(owner, other)
    admin.close()


def _client(server: KilnServer, tenant: Tenant) -> Client:
    account = tenant.accounts["member"]
    return Client(server.url, account.key_id, account.secret)


def _listed(kiln: Client, job_id: str, count: int) -> TensorBoardImageList:
    """The listing once the event files are in the store (copied as the attempt ended)."""
    deadline = time.monotonic() + 20
    while len((listed := kiln.tensorboard_images(job_id)).items) < count:
        assert time.monotonic() < deadline, listed
        time.sleep(0.2)
    return listed


def test_images_are_listed_with_their_step_and_served_byte_for_byte(
    shared_server: KilnServer, written: Written
) -> None:
    kiln = _client(shared_server, written.owner)
    listed = _listed(kiln, written.job_id, 6)
    assert not listed.truncated and listed.notes == []
    got = [(i.tag, i.step, i.index, i.width, i.height, i.media_type) for i in listed.items]
    assert got == [
        ("eval/pred", 1, 0, 4, 4, "image/png"),  # a file in a subdirectory: its tags under its name
        ("eval/pred", 1, 1, 4, 4, "image/png"),
        ("eval/pred", 2, 0, 4, 4, "image/png"),
        ("samples", 0, 0, 3, 2, "image/png"),
        ("samples", 5, 0, 3, 2, "image/png"),
        ("samples", 10, 0, 3, 2, "image/png"),
    ]
    assert {i.file.split("/")[0] for i in listed.items if i.tag == "eval/pred"} == {"eval"}
    assert [i.wall_time for i in listed.items if i.tag == "samples"] == [1_800_000_000, 1_800_000_005, 1_800_000_010]
    for item, expected in zip(listed.items, [PRED[0], PRED[1], PRED[0], *PNGS], strict=True):
        assert item.size == len(expected)
        assert kiln.tensorboard_image(written.job_id, item.file, item.offset, item.index) == expected

    # The route's own answer: the image's type, cached privately, never sniffed.
    first = listed.items[3]
    params = {"file": first.file, "offset": first.offset, "index": first.index}
    response = kiln.request("GET", f"/jobs/{written.job_id}/tensorboard-images/image", params=params)
    assert response.headers["content-type"] == "image/png"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cache-control"].startswith("private, max-age=")

    # What is no image, or no event file, is refused by name.
    for file, offset, index, error, says in (
        (first.file, 0, 0, NotFound, "holds no image"),  # the file_version record
        (first.file, first.offset + 1, 0, NotFound, "no record starts at byte"),
        (first.file, first.offset, 1, NotFound, "there is no image 1"),
        (first.file, 10**12, 0, NotFound, "no record at byte"),
        ("events.out.tfevents.0.nowhere", 0, 0, NotFound, "has no TensorBoard event file"),
        ("notes.txt", 0, 0, InvalidInput, "TensorBoard event files only"),
        ("../outputs/x", 0, 0, BadRequest, "'..'"),
    ):
        with pytest.raises(error, match=says):
            kiln.tensorboard_image(written.job_id, file, offset, index)
    kiln.close()


def test_another_organisation_gets_not_found(shared_server: KilnServer, written: Written) -> None:
    owner = _client(shared_server, written.owner)
    item = _listed(owner, written.job_id, 6).items[0]
    owner.close()
    intruder = _client(shared_server, written.other)
    with pytest.raises(NotFound, match="not found"):
        intruder.tensorboard_images(written.job_id)
    with pytest.raises(NotFound, match="not found"):
        intruder.tensorboard_image(written.job_id, item.file, item.offset, item.index)
    intruder.close()


@pytest.mark.needs("chromium")
@pytest.mark.timeout(300)
def test_the_console_shows_each_tags_image_at_a_chosen_step(shared_server: KilnServer, written: Written) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser import launch

    owner = _client(shared_server, written.owner)
    _listed(owner, written.job_id, 6)
    owner.close()
    member = written.owner.accounts["member"]
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{shared_server.url}/jobs/{written.job_id}?tab=artifacts")
            page.get_by_label("Access key id").fill(member.key_id)
            page.get_by_label("Secret key").fill(member.secret)
            page.get_by_role("button", name="Sign in").click()
            section = page.get_by_test_id("tensorboard-images")
            samples = section.locator('[data-tag="samples"]')
            expect(samples).to_be_visible()
            expect(samples.get_by_test_id("tb-image-step")).to_have_text("step 10")  # the last step first
            expect(samples.get_by_test_id("tb-image-steps")).to_contain_text("0, 5, 10")
            image = samples.locator("img")
            expect(image).to_be_visible()
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image.element_handle())
            assert image.evaluate("img => img.naturalWidth") == 3  # decoded: the real PNG
            samples.get_by_label("step").select_option("5")  # another step: its image
            expect(samples.get_by_test_id("tb-image-step")).to_have_text("step 5")
            expect(samples.locator("img")).to_have_attribute("src", re.compile("offset="))
            pred = section.locator('[data-tag="eval/pred"]')
            expect(pred.get_by_test_id("tb-image-step")).to_have_text("step 2")
            expect(pred.locator("img")).to_have_count(1)
            pred.get_by_label("step").select_option("1")  # a step whose record holds two images: both shown
            expect(pred.locator("img")).to_have_count(2)
        finally:
            browser.close()
