"""Seeded synthetic video clips for the video zoo: a coloured shape moving over a panning texture.

    clip = make_clip(seed=3)                # Clip(video [F, 3, H, W] in [-1, 1], caption, params)
    clip.caption                            # 'a red circle moving right'
    videos, captions = clip_batch(seeds)    # [B, 3, F, H, W] (the diffusers video layout), list

Every clip is a pure function of its seed (and size): the shape, colour, direction, speed, size,
start position, background shade and texture are drawn from a `torch.Generator` seeded by it, so
training batches, held-out clips and tests are reproducible on any machine. The shape bounces off
the frame edges, so longer clips stay in frame. Held-out clips use seeds from `HELDOUT_SEED` up.

The background is a grey level plus `TEXTURE_WAVES` plane waves of 2-5 cycles per frame that all
move with one camera pan: denoising such a clip needs a token's neighbours and the same place of
the scene in the other frames, the locality real video gives a video DiT's attention (on a plain
background every background token looks alike and attention spreads evenly). Draw order: the
shape's parameters first, so a seed's caption and shape are those of the plain-background clips.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

COLOURS = {  # name -> RGB in [0, 1]; saturated so "the caption's colour is dominant" is testable
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.8, 0.2),
    "blue": (0.15, 0.25, 0.95),
    "yellow": (0.95, 0.85, 0.1),
    "white": (0.95, 0.95, 0.95),
}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = {  # name -> (dy, dx) unit step in image coordinates (y down)
    "right": (0.0, 1.0), "left": (0.0, -1.0), "up": (-1.0, 0.0), "down": (1.0, 0.0),
}
TEXTURE_WAVES = 4  # plane waves in the background texture
HELDOUT_SEED = 1_000_000  # training seeds are step-derived and stay far below this
WORDS = ("a", "moving", *COLOURS, *SHAPES, *DIRECTIONS)  # the whole caption vocabulary


@dataclass(frozen=True)
class ClipParams:
    colour: str
    shape: str
    direction: str
    speed: float  # pixels per frame
    radius: float  # pixels
    start: tuple[float, float]  # (y, x) centre in pixels
    background: float  # grey level in [0, 1]
    pan: tuple[float, float] = (0.0, 0.0)  # (dy, dx) of the texture per frame, pixels
    # (ky, kx, phase, (r, g, b) amplitude) per wave, k in cycles per pixel; () = plain background
    waves: tuple = ()


@dataclass(frozen=True)
class Clip:
    video: torch.Tensor  # float [F, 3, H, W] in [-1, 1]
    caption: str
    params: ClipParams


def caption_of(p: ClipParams) -> str:
    return f"a {p.colour} {p.shape} moving {p.direction}"


def sample_params(seed: int, height: int, width: int) -> ClipParams:
    g = torch.Generator().manual_seed(int(seed))

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    def uniform(lo, hi):
        return lo + (hi - lo) * float(torch.rand((), generator=g))

    size = min(height, width)
    radius = uniform(0.15, 0.25) * size
    start = (uniform(radius, height - radius), uniform(radius, width - radius))
    colour, shape, direction = pick(list(COLOURS)), pick(SHAPES), pick(list(DIRECTIONS))
    speed, background = uniform(0.06, 0.12) * size, uniform(0.0, 0.35)
    pan = (uniform(-0.06, 0.06) * size, uniform(-0.06, 0.06) * size)
    waves = []
    for _ in range(TEXTURE_WAVES):
        cycles_y, cycles_x, angle = uniform(2, 5), uniform(2, 5), uniform(0, 2 * math.pi)
        phase = uniform(0, 2 * math.pi)
        amplitude = tuple(uniform(0.06, 0.12) for _ in range(3))
        waves.append((cycles_y * math.cos(angle) / height, cycles_x * math.sin(angle) / width,
                      phase, amplitude))
    return ClipParams(colour=colour, shape=shape, direction=direction, speed=speed, radius=radius,
                      start=start, background=background, pan=pan, waves=tuple(waves))


def _bounce(x0: float, step: float, lo: float, hi: float, frames: int) -> list[float]:
    """Positions of a point moving `step` per frame, reflected at `lo` and `hi`."""
    span, out = hi - lo, []
    for f in range(frames):
        u = (x0 - lo + step * f) % (2 * span)
        out.append(lo + (u if u <= span else 2 * span - u))
    return out


def _shape_mask(shape: str, cy: float, cx: float, r: float, yy, xx) -> torch.Tensor:
    """Soft (anti-aliased, 1 px ramp) coverage `[H, W]` in [0, 1]."""
    dy, dx = yy - cy, xx - cx
    if shape == "circle":
        dist = torch.sqrt(dy * dy + dx * dx) - r
    elif shape == "square":
        dist = torch.maximum(dy.abs(), dx.abs()) - r * 0.85
    else:  # upward triangle: inside the three half-planes of an equilateral triangle
        n = (math.sqrt(3) / 2, 0.5)
        dist = torch.maximum(torch.maximum(dy - r * 0.5, -dy * n[1] + dx * n[0] - r * 0.5),
                             -dy * n[1] - dx * n[0] - r * 0.5)
    return (0.5 - dist).clamp(0.0, 1.0)


def render(p: ClipParams, frames: int, height: int, width: int) -> torch.Tensor:
    """The clip of `p`: float `[F, 3, H, W]` in [-1, 1]."""
    yy = torch.arange(height, dtype=torch.float32).view(-1, 1) + 0.5
    xx = torch.arange(width, dtype=torch.float32).view(1, -1) + 0.5
    dy, dx = DIRECTIONS[p.direction]
    ys = _bounce(p.start[0], dy * p.speed, p.radius, height - p.radius, frames)
    xs = _bounce(p.start[1], dx * p.speed, p.radius, width - p.radius, frames)
    colour = torch.tensor(COLOURS[p.colour]).view(3, 1, 1)
    video = torch.empty(frames, 3, height, width)
    for f in range(frames):
        cover = _shape_mask(p.shape, ys[f], xs[f], p.radius, yy, xx)  # [H, W]
        video[f] = background(p, f, yy, xx) * (1 - cover) + colour * cover
    return video * 2 - 1


def background(p: ClipParams, frame: int, yy, xx) -> torch.Tensor:
    """The background of frame `frame`: `[3, H, W]` in [0, 1], the texture moved by the pan."""
    y, x = yy - p.pan[0] * frame, xx - p.pan[1] * frame
    out = torch.full((3, *torch.broadcast_shapes(yy.shape, xx.shape)), p.background)
    for ky, kx, phase, amplitude in p.waves:
        out += torch.tensor(amplitude).view(3, 1, 1) * torch.sin(2 * math.pi * (ky * y + kx * x)
                                                                 + phase)
    return out.clamp(0.0, 1.0)


def make_clip(seed: int, frames: int = 4, height: int = 32, width: int = 32) -> Clip:
    p = sample_params(seed, height, width)
    return Clip(render(p, frames, height, width), caption_of(p), p)


def clip_batch(seeds, frames: int = 4, height: int = 32, width: int = 32):
    """Clips of `seeds` -> (float `[B, 3, F, H, W]` in [-1, 1], captions)."""
    clips = [make_clip(s, frames, height, width) for s in seeds]
    return torch.stack([c.video.transpose(0, 1) for c in clips]), [c.caption for c in clips]


def main() -> None:  # python -m mmspec.zoo.clips: print a few captions and save a strip
    from PIL import Image

    videos, captions = clip_batch(range(6), frames=6)
    for i, c in enumerate(captions):
        print(i, c)
    strip = ((videos + 1) * 127.5).clamp(0, 255).byte()  # [B, 3, F, H, W]
    b, _, f, h, w = strip.shape
    img = strip.permute(0, 3, 2, 4, 1).reshape(b * h, f * w, 3).numpy()
    Image.fromarray(img).resize((f * w * 4, b * h * 4), Image.NEAREST).save("clips.png")
    print("wrote clips.png")


if __name__ == "__main__":
    main()
