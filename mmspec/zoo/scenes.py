"""Synthetic scenes for the VLM zoo: a seeded scene graph, its Pillow rendering, and the questions
and answers the target is trained on.

    scene = make_scene(seed)           # 1-4 shapes on a 3x3 grid, sometimes a word, a background
    image = render(seed)               # 64x64 RGB PIL image (drawn at 4x, downsampled)
    describe(scene)                    # several sentences: counts, colours, sizes, places, relations
    question_answer(scene)             # one (question, answer) pair, picked by the scene's seed

Everything is a pure function of the seed. Seeds below `HELDOUT_START` are the training split,
seeds from `HELDOUT_START` on are held out (the card's held-out figures and the tests use them).

The descriptions are long and full of image-dependent words (colours, shapes, positions, counts):
a text-only drafter can learn the sentence frames but has to guess those words, which is where a
vision-aware drafter (ViSpec) earns its longer accepted drafts.
"""

from __future__ import annotations

import numbers
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

IMAGE_SIZE = 64
SUPERSAMPLE = 4  # shapes are drawn at 4x and downsampled: anti-aliased edges at 64 px
HELDOUT_START = 10_000_000  # seeds >= this are the held-out split

COLOURS = {"red": (220, 30, 30), "orange": (255, 140, 0), "yellow": (250, 220, 20),
           "green": (30, 170, 50), "blue": (30, 80, 230), "purple": (140, 40, 190),
           "white": (250, 250, 250), "black": (15, 15, 15)}
BACKGROUNDS = {"gray": (128, 128, 128), "white": (250, 250, 250), "black": (15, 15, 15),
               "brown": (120, 75, 40)}
SHAPES = ("circle", "square", "triangle", "star", "diamond", "cross")
SIZES = {"small": 0.26, "large": 0.42}  # radius as a fraction of a grid cell
# the 3x3 grid, row-major: (row, col) -> name
PLACES = {(0, 0): "top left", (0, 1): "top", (0, 2): "top right",
          (1, 0): "left", (1, 1): "centre", (1, 2): "right",
          (2, 0): "bottom left", (2, 1): "bottom", (2, 2): "bottom right"}
WORDS = ("HI", "OK", "GO", "YES", "NO", "SUN", "CAT", "DOG", "BOX", "RED", "TOP", "MAP")
NUMBERS = ("zero", "one", "two", "three", "four", "five")


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    size: str
    cell: tuple  # (row, col) in the 3x3 grid

    @property
    def place(self) -> str:
        return PLACES[self.cell]


@dataclass(frozen=True)
class Scene:
    seed: int
    background: str
    shapes: tuple  # Shape, in reading order (top-left to bottom-right)
    text: str | None
    text_cell: tuple | None
    text_colour: str | None


def make_scene(seed: int) -> Scene:
    # random.Random also takes None (a fresh seed each call), strings and floats, and seeds -s as s
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed: expected an int (the scene is a pure function of it), got "
                        f"{type(seed).__name__} {seed!r}")
    if seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed}")
    seed = int(seed)  # a numpy int too
    rng = random.Random(seed)
    background = rng.choice(list(BACKGROUNDS))
    n = rng.choice((1, 2, 2, 3, 3, 4))
    has_text = rng.random() < 0.3
    cells = rng.sample(sorted(PLACES), n + has_text)
    # repeated kinds make counting sentences ("two circles") common
    kinds = rng.sample(SHAPES, rng.randint(1, n))
    palette = [c for c in COLOURS if c != background]
    shapes = tuple(sorted((Shape(rng.choice(kinds) if i >= len(kinds) else kinds[i],
                                 rng.choice(palette), rng.choice(list(SIZES)), cells[i])
                           for i in range(n)), key=lambda s: s.cell))
    text = text_cell = text_colour = None
    if has_text:
        text, text_cell = rng.choice(WORDS), cells[n]
        text_colour = "black" if background in ("white", "gray") else "white"
    return Scene(seed, background, shapes, text, text_cell, text_colour)


# --- rendering ---

def _polygon(kind: str, cx: float, cy: float, r: float) -> list:
    if kind == "square":
        r *= 0.85
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if kind == "triangle":
        return [(cx, cy - r), (cx + r, cy + 0.8 * r), (cx - r, cy + 0.8 * r)]
    if kind == "diamond":
        return [(cx, cy - r), (cx + 0.75 * r, cy), (cx, cy + r), (cx - 0.75 * r, cy)]
    if kind == "star":
        import math
        return [(cx + (r if i % 2 == 0 else 0.45 * r) * math.sin(i * math.pi / 5),
                 cy - (r if i % 2 == 0 else 0.45 * r) * math.cos(i * math.pi / 5))
                for i in range(10)]
    if kind == "cross":
        a = 0.35 * r
        return [(cx - a, cy - r), (cx + a, cy - r), (cx + a, cy - a), (cx + r, cy - a),
                (cx + r, cy + a), (cx + a, cy + a), (cx + a, cy + r), (cx - a, cy + r),
                (cx - a, cy + a), (cx - r, cy + a), (cx - r, cy - a), (cx - a, cy - a)]
    raise ValueError(f"kind: expected one of {SHAPES}, got {kind!r}")


def render_scene(scene: Scene) -> Image.Image:
    """The scene as a 64x64 RGB image; small position jitter comes from the scene's seed."""
    big = IMAGE_SIZE * SUPERSAMPLE
    image = Image.new("RGB", (big, big), BACKGROUNDS[scene.background])
    draw = ImageDraw.Draw(image)
    for shape, cx, cy, r in _geometry(scene):
        _draw(draw, shape.kind, cx, cy, r, fill=COLOURS[shape.colour])
    image = image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)
    if scene.text is not None:  # drawn at the final size: a supersampled word would blur away
        draw = ImageDraw.Draw(image)
        font = ImageFont.load_default(size=10)
        row, col = scene.text_cell
        c = IMAGE_SIZE / 3
        draw.text(((col + 0.5) * c, (row + 0.5) * c), scene.text, font=font, anchor="mm",
                  fill=COLOURS[scene.text_colour])
    return image


def _geometry(scene: Scene):
    """(shape, cx, cy, r) in supersampled pixels; the position jitter comes from the seed."""
    rng = random.Random(scene.seed * 7 + 1)
    cell = IMAGE_SIZE * SUPERSAMPLE / 3
    for shape in scene.shapes:
        row, col = shape.cell
        cx = (col + 0.5) * cell + rng.uniform(-0.08, 0.08) * cell
        cy = (row + 0.5) * cell + rng.uniform(-0.08, 0.08) * cell
        yield shape, cx, cy, SIZES[shape.size] * cell


def _draw(draw, kind: str, cx: float, cy: float, r: float, fill) -> None:
    if kind == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    else:
        draw.polygon(_polygon(kind, cx, cy, r), fill=fill)


# what each vision patch shows (mmspec.zoo.training.train_vlm's vision pre-training labels)
PATCH_COLOURS = tuple(dict.fromkeys((*COLOURS, *BACKGROUNDS)))  # 8 shape + 2 background-only
NO_SHAPE = len(SHAPES)  # the kind label of a patch that shows no shape


def patch_labels(scene: Scene, patch: int) -> tuple[list[int], list[int]]:
    """Per `patch`x`patch` patch of the image, row-major: (colour index into `PATCH_COLOURS`, kind
    index into `SHAPES` or `NO_SHAPE`). A patch shows a shape when that shape covers at least 20%
    of it; otherwise it shows the background. The word (if any) is not labelled."""
    if IMAGE_SIZE % patch:
        raise ValueError(f"patch: expected a divisor of the image size {IMAGE_SIZE}, got {patch}")
    big = IMAGE_SIZE * SUPERSAMPLE
    index = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(index)
    for i, (shape, cx, cy, r) in enumerate(_geometry(scene)):
        _draw(draw, shape.kind, cx, cy, r, fill=i + 1)
    n, side = IMAGE_SIZE // patch, patch * SUPERSAMPLE
    blocks = np.asarray(index).reshape(n, side, n, side).transpose(0, 2, 1, 3).reshape(n * n, -1)
    colours, kinds = [], []
    for block in blocks:
        counts = np.bincount(block, minlength=len(scene.shapes) + 1)
        best = int(counts[1:].argmax()) + 1 if len(counts) > 1 else 0
        if best and counts[best] >= 0.2 * block.size:
            shape = scene.shapes[best - 1]
            colours.append(PATCH_COLOURS.index(shape.colour))
            kinds.append(SHAPES.index(shape.kind))
        else:
            colours.append(PATCH_COLOURS.index(scene.background))
            kinds.append(NO_SHAPE)
    return colours, kinds


def render(seed: int) -> Image.Image:
    """The image of scene `seed`."""
    return render_scene(make_scene(seed))


# --- language ---

def _plural(kind: str, n: int) -> str:
    return kind if n == 1 else ("crosses" if kind == "cross" else kind + "s")


def _count_phrase(scene: Scene) -> str:
    counts: dict = {}
    for s in scene.shapes:
        counts[s.kind] = counts.get(s.kind, 0) + 1
    parts = [f"{NUMBERS[n]} {_plural(k, n)}" for k, n in counts.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _relation(a: Shape, b: Shape) -> str:
    """How `b` sits relative to `a` (b comes later in reading order)."""
    (ra, ca), (rb, cb) = a.cell, b.cell
    if ra == rb:
        side = "to the right of"
    elif ca == cb:
        side = "below"
    else:
        side = ("below and to the right of" if cb > ca else "below and to the left of")
    return f"The {b.colour} {b.kind} is {side} the {a.colour} {a.kind}."


def _at(place: str) -> str:
    return "in the centre" if place == "centre" else (
        f"on the {place}" if place in ("left", "right") else f"at the {place}")


def describe(scene: Scene) -> str:
    """A long description; its phrasing varies with the seed, its content is the scene's."""
    rng = random.Random(scene.seed * 13 + 5)
    n = len(scene.shapes)
    noun = "shape" if n == 1 else "shapes"
    opening = rng.choice(("The image shows", "This picture shows", "In this image there are",
                          "The picture contains"))
    if opening == "In this image there are" and n == 1:
        opening = "In this image there is"
    out = [f"{opening} {NUMBERS[n]} {noun} on a {scene.background} background."]
    out.append(f"There {'is' if n == 1 else 'are'} {_count_phrase(scene)}.")
    for i, s in enumerate(scene.shapes):
        lead = ("First" if i == 0 else "Next" if i < n - 1 else "Finally") if n > 1 else "It"
        verb = rng.choice(("there is", "we see", "I can see"))
        if n == 1:
            out.append(f"It is a {s.size} {s.colour} {s.kind} {_at(s.place)} of the image.")
        else:
            out.append(f"{lead}, {verb} a {s.size} {s.colour} {s.kind} {_at(s.place)}.")
        out.append(f"The {s.kind} is {s.colour} and {s.size}.")
    for a, b in zip(scene.shapes, scene.shapes[1:]):
        out.append(_relation(a, b))
    if scene.text is not None:
        out.append(f'The word "{scene.text}" is written in {scene.text_colour} '
                   f'{_at(PLACES[scene.text_cell])}.')
    else:
        out.append("There is no text in the image.")
    colours = sorted({s.colour for s in scene.shapes}, key=list(COLOURS).index)
    colour_list = colours[0] if len(colours) == 1 else ", ".join(colours[:-1]) + " and " + colours[-1]
    out.append(f"In total, the image has {NUMBERS[n]} {noun}: {_count_phrase(scene)}, "
               f"coloured {colour_list}.")
    return " ".join(out)


DESCRIBE_PROMPTS = ("Describe the image.", "Describe the image in detail.",
                    "What is in this picture?")


def colour_question(scene: Scene, index: int = 0) -> tuple[str, str]:
    """("What colour is the <kind of shape `index`>?", the answer naming every shape of that kind)."""
    kind = scene.shapes[index].kind
    same = [s for s in scene.shapes if s.kind == kind]
    if len(same) == 1:
        return f"What colour is the {kind}?", f"The {kind} is {same[0].colour}."
    each = " and ".join(f"one is {s.colour}" for s in same)
    return f"What colour is the {kind}?", f"There are {NUMBERS[len(same)]} {_plural(kind, 2)}: {each}."


def question_answer(scene: Scene, describe_share: float = 0.6,
                    colour_share: float = 0.0) -> tuple[str, str]:
    """One (question, answer) pair for the scene, chosen by its seed; most are descriptions.

    With `colour_share` > 0 that share of scenes is first set aside for a colour question about a
    random shape; `describe_share` then applies to the rest (colour_share 0 draws exactly as
    before, so earlier runs' data is unchanged)."""
    for name, share in (("describe_share", describe_share), ("colour_share", colour_share)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name}: expected a share in [0, 1], got {share}")
    rng = random.Random(scene.seed * 31 + 11)
    if colour_share and rng.random() < colour_share:
        return colour_question(scene, rng.randrange(len(scene.shapes)))
    if rng.random() < describe_share:
        return rng.choice(DESCRIBE_PROMPTS), describe(scene)
    kind = rng.choice(("colour", "colour", "shapes", "count", "text", "background"))
    if kind == "colour":
        return colour_question(scene, rng.randrange(len(scene.shapes)))
    if kind == "shapes":
        return "What shapes do you see?", f"I see {_count_phrase(scene)}."
    if kind == "count":
        n = len(scene.shapes)
        return "How many shapes are there?", (
            f"There {'is' if n == 1 else 'are'} {NUMBERS[n]} {'shape' if n == 1 else 'shapes'}.")
    if kind == "text":
        return "What is written on the image?", (
            f'The word "{scene.text}" is written on the image.' if scene.text
            else "There is no text on the image.")
    return "What colour is the background?", f"The background is {scene.background}."


def corpus(seeds) -> list[str]:
    """Every prompt and answer text of `seeds` (for tokenizer training)."""
    texts = list(DESCRIBE_PROMPTS)
    for seed in seeds:
        scene = make_scene(seed)
        texts += [describe(scene), *question_answer(scene)]
    return texts
