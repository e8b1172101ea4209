"""demos/vlm_chat.py in Chromium on a tiny random LLaVA (the zoo VLM is not needed): an uploaded
image and a question stream an answer with accepted tokens highlighted and a live tau; no image,
an unreadable file and an empty question give readable messages."""

import sys
from pathlib import Path

import pytest

from .conftest import launched, screenshot, served

pytestmark = pytest.mark.browser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vision"))


QUESTION = "w7 w8 w9"


@pytest.fixture(scope="module")
def app():
    from PIL import Image
    from tiny_vlms import no_eos, quick_train, tiny_llava, tiny_llava_processor

    from demos.vlm_chat import TEXT_ONLY, VISPEC, Chat, build_app
    from mmspec.vision import ViSpecDrafter
    from mmspec.zoo import vlm_inputs

    target, processor = no_eos(tiny_llava()), tiny_llava_processor()
    samples = []  # a few seconds of training on the page's prompt, so that drafts get accepted
    for colour in ((200, 30, 30), (30, 200, 30), (30, 30, 200)):
        inputs = vlm_inputs(processor, Image.new("RGB", (64, 48), colour), QUESTION)
        samples.append((inputs.pop("input_ids"), inputs))
    drafter = ViSpecDrafter.from_target(target)
    quick_train(drafter, target, samples, steps=40)
    chat = Chat(target, processor,
                {VISPEC: drafter.eval(), TEXT_ONLY: ViSpecDrafter.text_only(target)},
                question=QUESTION, name="tiny random LLaVA")
    return build_app(chat, max_new_tokens=32)


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("img") / "red.png"
    Image.new("RGB", (64, 48), (200, 30, 30)).save(path)
    return path


def test_upload_and_ask_streams_a_highlighted_answer(app, page, image_file):
    with served(app) as url:
        page.goto(url)
        page.locator("#image-file input[type=file]").set_input_files(str(image_file))
        page.locator("#ask").click()
        status = page.locator("#status")
        status.get_by_text("done").wait_for()
        text = status.inner_text()
        assert "τ =" in text and "tokens/s" in text and "32 tokens" in text
        assert page.locator("#answer .tok-bonus").count() > 0
        assert page.locator("#answer .tok-accepted").count() > 0  # the trained drafter's tokens
        assert "w" in page.locator("#answer").inner_text()
        screenshot(page, "vlm_chat")


def test_target_only_mode(app, page, image_file):
    with served(app) as url:
        page.goto(url)
        page.locator("#image-file input[type=file]").set_input_files(str(image_file))
        page.locator("#mode").get_by_text("target only").click()
        page.locator("#ask").click()
        page.locator("#status").get_by_text("done").wait_for()
        assert "τ = 1.00" in page.locator("#status").inner_text()  # one token per forward
        assert page.locator("#answer .tok-accepted").count() == 0


def test_bad_inputs_show_messages(app, page, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"this is not a png")
    with served(app) as url:
        page.goto(url)
        page.locator("#ask").click()  # no image
        page.locator("#status").get_by_text("Please upload an image first").wait_for()
        page.locator("#image-file input[type=file]").set_input_files(str(broken))
        page.locator("#status").get_by_text("Could not read broken.png").wait_for()
        page.locator("#ask").click()
        page.locator("#status").get_by_text("Could not read broken.png").wait_for()
        assert "Traceback" not in page.content()
        page.wait_for_timeout(500)
        screenshot(page, "vlm_chat_bad_file")


def test_command_line_with_saved_checkpoints(page, image_file, tmp_path):
    """`python demos/vlm_chat.py --target PATH --drafter PATH`: any saved HF VLM + ViSpec drafter."""
    from tiny_vlms import no_eos, tiny_llava, tiny_llava_processor

    from mmspec.vision import ViSpecDrafter

    target = no_eos(tiny_llava())
    target.save_pretrained(tmp_path / "target")
    tiny_llava_processor().save_pretrained(tmp_path / "target")
    ViSpecDrafter.from_target(target).save_pretrained(tmp_path / "vispec")
    with launched("vlm_chat.py", "--target", str(tmp_path / "target"),
                  "--drafter", str(tmp_path / "vispec"), "--max-new-tokens", "16") as (url, _):
        page.goto(url)
        assert page.locator("#mode").get_by_text("text-only drafter").count() == 0  # not given
        page.locator("#image-file input[type=file]").set_input_files(str(image_file))
        page.locator("#question input, #question textarea").first.fill("w7 w8")
        page.locator("#ask").click()
        page.locator("#status").get_by_text("done").wait_for()
        assert "16 tokens" in page.locator("#status").inner_text()


def test_bad_command_lines_are_messages_not_tracebacks(tmp_path, capsys):
    # a missing folder read as a hub repo id ("Repo id must use alphanumeric chars"), a text LM
    # as target listed 100 config classes, --threads 0 failed in torch.set_num_threads
    from demos import dlm_lattice, vlm_chat
    from mmspec.zoo.paths import ZOO_DIR

    vispec = str(ZOO_DIR / "vlm-vispec")
    with pytest.raises(SystemExit, match=r"--target: no such model folder .*nope"):
        vlm_chat.main(["--target", str(tmp_path / "nope"), "--drafter", vispec])
    with pytest.raises(SystemExit, match=r"--target .*text-target: cannot load it as a "
                                         r"vision-language model: Unrecognized configuration"):
        vlm_chat.main(["--target", str(ZOO_DIR / "text-target"), "--drafter", vispec])
    target = str(ZOO_DIR / "vlm-target")
    with pytest.raises(SystemExit, match=r"--drafter .*nope: path: no vispec_config.json"):
        vlm_chat.main(["--target", target, "--drafter", str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match=r"--text-drafter .*vlm-target: path: no vispec_config"):
        vlm_chat.main(["--target", target, "--drafter", vispec, "--text-drafter", target])
    for main in (vlm_chat.main, dlm_lattice.main):
        with pytest.raises(SystemExit) as err:
            main(["--threads", "0"])
        assert err.value.code == 2
        assert "argument --threads: must be an int >= 1, got 0" in capsys.readouterr().err
