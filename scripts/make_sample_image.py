"""Draw libreyolo's sample image: a procedurally painted 1280x720 street scene.

We cannot ship a downloaded photo, so this script paints one with PIL and numpy alone: sky, buildings
with windows, a road with markings, pedestrians, cars, a bicycle, a dog and a traffic light, shaded
with gradients, soft shadows and a little sensor noise so it reads as a picture rather than a
diagram. It is deterministic (fixed seed), so re-running it reproduces the committed file.

    python scripts/make_sample_image.py [--out PATH]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

WIDTH, HEIGHT = 1280, 720
SCALE = 2  # paint at twice the size, then downsample: cheap anti-aliasing
SEED = 20240611
QUALITY = 90

Color = tuple[int, int, int]
Point = tuple[float, float]


def mix(a: Color, b: Color, t: float) -> Color:
    """Linear blend of two colours (t=0 -> a, t=1 -> b)."""
    return tuple(int(round(a[i] + (b[i] - a[i]) * t)) for i in range(3))  # type: ignore[return-value]


def shade(c: Color, f: float) -> Color:
    """Darken (f < 1) or lighten (f > 1, towards white) a colour."""
    if f <= 1:
        return tuple(int(v * f) for v in c)  # type: ignore[return-value]
    return mix(c, (255, 255, 255), min(1.0, f - 1))


class Painter:
    """Paints shapes given in output (1x) coordinates onto a SCALE-times larger canvas.

    Every shape is drawn as a mask first, so one code path gives solid fills, vertical or
    horizontal gradients, partial opacity and blur (soft shadows, glows).
    """

    def __init__(self, width: int, height: int, scale: int) -> None:
        self.s = scale
        self.img = Image.new("RGB", (width * scale, height * scale))

    def _pts(self, pts: Sequence[Point]) -> list[tuple[float, float]]:
        return [(x * self.s, y * self.s) for x, y in pts]

    def _box(self, box: Sequence[float]) -> list[float]:
        x0, y0, x1, y1 = (v * self.s for v in box)
        return [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]  # corners in either order

    def paint(
        self,
        draw_mask: Callable[[ImageDraw.ImageDraw], None],
        color: Color,
        color2: Color | None = None,
        *,
        horizontal: bool = False,
        alpha: float = 1.0,
        blur: float = 0.0,
    ) -> None:
        """Fill the shape that ``draw_mask`` draws (value 255) with a colour or gradient."""
        mask = Image.new("L", self.img.size, 0)
        draw_mask(ImageDraw.Draw(mask))
        if blur > 0:
            mask = mask.filter(ImageFilter.GaussianBlur(blur * self.s))
        if alpha < 1:
            mask = mask.point(lambda v: int(v * alpha))
        bbox = mask.getbbox()
        if bbox is None:
            return
        crop = mask.crop(bbox)
        if color2 is None:
            self.img.paste(color, bbox, crop)
            return
        w, h = bbox[2] - bbox[0], bbox[3] - bbox[1]
        n = w if horizontal else h
        t = np.linspace(0.0, 1.0, max(n, 1))[:, None]
        ramp = np.asarray(color, float) * (1 - t) + np.asarray(color2, float) * t
        grad = ramp[None, :, :] if horizontal else ramp[:, None, :]
        grad = np.broadcast_to(grad, (h, w, 3)).astype(np.uint8)
        self.img.paste(Image.fromarray(np.ascontiguousarray(grad)), bbox, crop)

    # Convenience wrappers: all coordinates in 1x pixels.
    def rect(self, box: Sequence[float], color: Color, color2: Color | None = None, *,
             radius: float = 0, **kw: float | bool) -> None:
        b, r = self._box(box), radius * self.s
        self.paint(lambda d: d.rounded_rectangle(b, radius=r, fill=255) if r else d.rectangle(b, fill=255),
                   color, color2, **kw)

    def ellipse(self, box: Sequence[float], color: Color, color2: Color | None = None,
                **kw: float | bool) -> None:
        b = self._box(box)
        self.paint(lambda d: d.ellipse(b, fill=255), color, color2, **kw)

    def circle(self, cx: float, cy: float, r: float, color: Color, color2: Color | None = None,
               **kw: float | bool) -> None:
        self.ellipse((cx - r, cy - r, cx + r, cy + r), color, color2, **kw)

    def poly(self, pts: Sequence[Point], color: Color, color2: Color | None = None,
             **kw: float | bool) -> None:
        p = self._pts(pts)
        self.paint(lambda d: d.polygon(p, fill=255), color, color2, **kw)

    def line(self, pts: Sequence[Point], width: float, color: Color, color2: Color | None = None,
             *, round_caps: bool = True, **kw: float | bool) -> None:
        """A polyline of the given width, with rounded joints and (optionally) rounded ends."""
        p, w = self._pts(pts), width * self.s

        def draw(d: ImageDraw.ImageDraw) -> None:
            d.line(p, fill=255, width=max(1, int(round(w))), joint="curve")
            if round_caps:
                for x, y in (p[0], p[-1]):
                    d.ellipse((x - w / 2, y - w / 2, x + w / 2, y + w / 2), fill=255)

        self.paint(draw, color, color2, **kw)

    def ring(self, cx: float, cy: float, r: float, width: float, color: Color, **kw: float | bool) -> None:
        b = self._box((cx - r, cy - r, cx + r, cy + r))
        self.paint(lambda d: d.ellipse(b, outline=255, width=max(1, int(width * self.s))), color, **kw)

    def shadow(self, cx: float, cy: float, rx: float, ry: float, alpha: float = 0.45) -> None:
        """A soft contact shadow on the ground."""
        self.ellipse((cx - rx, cy - ry, cx + rx, cy + ry), (10, 10, 14), alpha=alpha, blur=ry * 0.6)


# --------------------------------------------------------------------------------------------------
# Scene parts.

HORIZON = 300
SIDEWALK_TOP = 452
CURB = 500
ROAD_BOTTOM = HEIGHT


def sky_and_backdrop(p: Painter, rng: np.random.Generator) -> None:
    p.rect((0, 0, WIDTH, SIDEWALK_TOP), (74, 128, 196), (206, 222, 236))
    for _ in range(7):  # soft clouds
        cx, cy = rng.uniform(0, WIDTH), rng.uniform(30, 170)
        for _ in range(5):
            ox, oy = rng.normal(0, 45), rng.normal(0, 10)
            rx, ry = rng.uniform(50, 110), rng.uniform(16, 30)
            p.ellipse((cx + ox - rx, cy + oy - ry, cx + ox + rx, cy + oy + ry), (250, 252, 255),
                      alpha=0.35, blur=14)
    # Distant skyline, hazy blue-grey.
    x = -20.0
    while x < WIDTH:
        w, top = rng.uniform(50, 120), rng.uniform(150, 290)
        tone = int(rng.uniform(150, 175))
        p.rect((x, top, x + w, SIDEWALK_TOP), (tone - 10, tone, tone + 18), (tone - 25, tone - 15, tone + 2))
        x += w - rng.uniform(0, 15)


def window_grid(p: Painter, rng: np.random.Generator, x0: float, x1: float, y0: float, y1: float,
                cols: int, rows: int, frame: Color, lit_p: float = 0.15) -> None:
    cw, rh = (x1 - x0) / cols, (y1 - y0) / rows
    for r in range(rows):
        for c in range(cols):
            wx0, wy0 = x0 + c * cw + cw * 0.2, y0 + r * rh + rh * 0.18
            wx1, wy1 = wx0 + cw * 0.6, wy0 + rh * 0.62
            p.rect((wx0 - 3, wy0 - 3, wx1 + 3, wy1 + 5), frame)
            if rng.random() < lit_p:
                glass = ((255, 226, 160), (236, 182, 104))
            else:
                g = rng.uniform(0.85, 1.1)
                glass = (shade((120, 150, 178), g), shade((46, 60, 80), g))
            p.rect((wx0, wy0, wx1, wy1), glass[0], glass[1])
            p.poly([(wx0, wy0), (wx0 + (wx1 - wx0) * 0.45, wy0), (wx0, wy0 + (wy1 - wy0) * 0.6)],
                   (255, 255, 255), alpha=0.12)  # sky reflection
            p.rect((wx0 - 4, wy1 + 2, wx1 + 4, wy1 + 7), shade(frame, 1.15))  # sill


def buildings(p: Painter, rng: np.random.Generator) -> None:
    specs = [  # x0, x1, top, wall colour, window columns, rows
        (-10, 250, 60, (164, 84, 62), 4, 6),
        (250, 470, 140, (214, 196, 160), 3, 5),
        (470, 760, 40, (118, 128, 138), 5, 7),
        (760, 960, 120, (196, 150, 96), 3, 5),
        (960, 1290, 80, (92, 118, 112), 5, 6),
    ]
    for x0, x1, top, wall, cols, rows in specs:
        p.rect((x0, top, x1, SIDEWALK_TOP), shade(wall, 1.08), shade(wall, 0.78))
        p.rect((x0, top, x1, top + 12), shade(wall, 0.6))  # cornice
        p.rect((x0, top + 12, x1, top + 18), (0, 0, 0), alpha=0.18, blur=2)
        p.rect((x1 - 8, top, x1, SIDEWALK_TOP), (0, 0, 0), alpha=0.18, blur=3)  # edge shading
        window_grid(p, rng, x0 + 10, x1 - 10, top + 30, SIDEWALK_TOP - 110, cols, rows, shade(wall, 1.25))
        # Ground floor: a shop window or a door.
        gy = SIDEWALK_TOP - 95
        p.rect((x0, gy - 6, x1, gy), shade(wall, 0.55))
        sx0, sx1 = x0 + 25, x1 - 80
        p.rect((sx0, gy + 18, sx1, SIDEWALK_TOP - 4), (70, 86, 100), (26, 32, 40))
        p.poly([(sx0, gy + 18), (sx0 + 60, gy + 18), (sx0 + 10, SIDEWALK_TOP - 4), (sx0, SIDEWALK_TOP - 4)],
               (255, 255, 255), alpha=0.10)
        dx = x1 - 65
        p.rect((dx, gy + 8, dx + 42, SIDEWALK_TOP - 2), shade(wall, 0.45), shade(wall, 0.3))
        p.circle(dx + 34, gy + 55, 2.5, (210, 190, 120))
        # Striped awning above the shop window.
        stripe = [(200, 60, 50), (40, 110, 90), (40, 70, 140), (180, 120, 40), (110, 60, 120)][
            int(rng.integers(5))]
        n = max(3, int((sx1 - sx0 + 20) / 26))
        step = (sx1 - sx0 + 20) / n
        for i in range(n):
            col = stripe if i % 2 == 0 else (238, 232, 220)
            ax = sx0 - 10 + i * step
            p.poly([(ax, gy - 4), (ax + step, gy - 4), (ax + step + 4, gy + 18), (ax + 4, gy + 18)],
                   shade(col, 1.05), shade(col, 0.8))
        p.rect((sx0 - 6, gy + 18, sx1 + 14, gy + 26), (0, 0, 0), alpha=0.25, blur=3)


def street(p: Painter, rng: np.random.Generator) -> None:
    # Sidewalk with paving joints, then the curb, then the road.
    p.rect((0, SIDEWALK_TOP, WIDTH, CURB), (178, 174, 168), (150, 146, 140))
    for i in range(1, 4):
        y = SIDEWALK_TOP + i * (CURB - SIDEWALK_TOP) / 4
        p.rect((0, y, WIDTH, y + 1.2), (120, 116, 110), alpha=0.6)
    for x in np.arange(-40, WIDTH + 40, 64):
        p.line([(x, SIDEWALK_TOP), (x - 22, CURB)], 1.2, (120, 116, 110), round_caps=False, alpha=0.6)
    p.rect((0, CURB - 4, WIDTH, CURB + 8), (196, 192, 186), (120, 118, 114))
    p.rect((0, CURB + 8, WIDTH, ROAD_BOTTOM), (74, 74, 78), (52, 52, 56))
    p.rect((0, CURB + 8, WIDTH, CURB + 22), (0, 0, 0), alpha=0.35, blur=6)  # curb shadow
    # Lane markings: a dashed centre line and an edge line.
    for x in np.arange(-30, WIDTH, 150):
        p.poly([(x, 604), (x + 90, 604), (x + 94, 612), (x + 3, 612)], (236, 236, 228), (200, 200, 190))
    p.rect((0, 700, WIDTH, 706), (226, 214, 120), alpha=0.9)
    # Crosswalk: seen from the side its stripes are bands along the road, wider as they come nearer.
    y = CURB + 16.0
    while y < 690:
        band = 10 + (y - CURB) * 0.09
        p.poly([(46 + (y - CURB) * 0.12, y), (210 + (y - CURB) * 0.12, y),
                (214 + (y + band - CURB) * 0.12, y + band), (42 + (y + band - CURB) * 0.12, y + band)],
               (232, 232, 226), (208, 208, 202), alpha=0.92)
        y += band * 1.9
    # Patches and cracks in the asphalt.
    for _ in range(10):
        cx, cy = rng.uniform(0, WIDTH), rng.uniform(CURB + 30, ROAD_BOTTOM)
        rx, ry = rng.uniform(30, 90), rng.uniform(6, 16)
        p.ellipse((cx - rx, cy - ry, cx + rx, cy + ry), (30, 30, 34), alpha=0.18, blur=6)


def tree(p: Painter, rng: np.random.Generator, x: float) -> None:
    p.shadow(x + 20, CURB - 14, 70, 8, alpha=0.35)
    p.line([(x, CURB - 12), (x - 4, 300), (x + 8, 250)], 14, (96, 70, 50), (66, 48, 34))
    p.line([(x - 2, 320), (x - 40, 270)], 7, (86, 62, 44))
    p.line([(x + 2, 300), (x + 38, 262)], 7, (86, 62, 44))
    for n, spread, rmin, rmax, dim in ((30, 52, 22, 34, 0.7), (60, 46, 12, 22, 1.0)):  # back, front
        for _ in range(n):
            cx = x + float(np.clip(rng.normal(0, spread), -2 * spread, 1.6 * spread))
            cy = 232 + float(np.clip(rng.normal(0, spread * 0.62), -1.2 * spread, 1.2 * spread))
            r = rng.uniform(rmin, rmax)
            g = rng.uniform(0.8, 1.15) * dim * (1.1 - 0.3 * (cy - 180) / 110)
            p.circle(cx, cy, r, shade((98, 150, 70), g), shade((46, 88, 40), g))
    for _ in range(14):  # sunlit leaves on top
        cx, cy = x + rng.normal(-8, 34), 200 + rng.normal(0, 18)
        p.circle(cx, cy, rng.uniform(8, 15), (156, 200, 104), alpha=0.45, blur=2)


def traffic_light(p: Painter, x: float) -> None:
    base = CURB - 6
    p.shadow(x + 4, base, 22, 5)
    p.rect((x - 6, 170, x + 6, base), (150, 154, 160), (70, 72, 78), horizontal=True)
    p.rect((x - 11, base - 10, x + 11, base), (90, 92, 98), horizontal=True)
    p.rect((x - 24, 120, x + 24, 252), (44, 46, 50), (20, 21, 24), radius=8)
    p.rect((x - 24, 120, x - 16, 252), (255, 255, 255), alpha=0.08, radius=4)
    lamps = [(150, (90, 28, 24)), (186, (90, 72, 18)), (222, (60, 255, 150))]
    for cy, col in lamps:
        p.rect((x - 19, cy - 19, x + 19, cy - 12), (8, 8, 10), radius=3)  # visor
        p.circle(x, cy, 13, shade(col, 1.0), shade(col, 0.7))
    p.circle(x, 222, 26, (80, 255, 170), alpha=0.45, blur=10)  # glow of the lit lamp
    p.circle(x - 3, 219, 5, (230, 255, 240), alpha=0.9, blur=1.5)


def person(p: Painter, x: float, foot_y: float, height: float, *, shirt: Color, pants: Color,
           skin: Color, hair: Color, stride: float = 0.0, facing: int = 1, bag: Color | None = None,
           dress: bool = False) -> Point:
    """A standing or walking figure with its feet at (x, foot_y); ``stride`` in [0, 1].

    Returns the front hand's position, so a leash or a bag can be attached to it.
    """
    H = height
    head_r = H * 0.07
    head_cy = foot_y - H + head_r
    sh_y, hip_y, knee_y = foot_y - H * 0.83, foot_y - H * 0.49, foot_y - H * 0.25
    sh_w, hip_w = H * 0.14, H * 0.105
    leg_w, arm_w = H * 0.085, H * 0.058
    p.shadow(x + 8, foot_y, H * 0.2, H * 0.025)
    step = stride * H * 0.16
    # Legs: back leg first (darker), then front leg.
    for sgn, dim in ((-1, 0.78), (1, 1.0)):
        hx = x + sgn * hip_w * 0.45
        kx = hx + sgn * step * 0.55
        fx = hx + sgn * step
        col = shade(pants, dim)
        p.line([(hx, hip_y), (kx, knee_y), (fx, foot_y - H * 0.03)], leg_w, col, shade(col, 0.8))
        p.ellipse((fx - H * 0.03 + facing * H * 0.02 - H * 0.035, foot_y - H * 0.05,
                   fx + facing * H * 0.02 + H * 0.05, foot_y + H * 0.005), (34, 30, 30), (14, 12, 12))
    # Back arm.
    swing = stride * H * 0.1
    p.line([(x - facing * sh_w * 0.7, sh_y + H * 0.03), (x - facing * sh_w * 0.9 + swing, hip_y - H * 0.02),
            (x - facing * sh_w * 0.8 + swing * 1.4, hip_y + H * 0.08)], arm_w, shade(shirt, 0.7))
    # Torso (or dress) with shading.
    if dress:
        p.poly([(x - sh_w, sh_y), (x + sh_w, sh_y), (x + hip_w * 1.6, knee_y + H * 0.03),
                (x - hip_w * 1.6, knee_y + H * 0.03)], shade(shirt, 1.1), shade(shirt, 0.7))
    else:
        p.poly([(x - sh_w, sh_y), (x + sh_w, sh_y), (x + hip_w, hip_y + H * 0.02),
                (x - hip_w, hip_y + H * 0.02)], shade(shirt, 1.1), shade(shirt, 0.72))
        p.rect((x - hip_w, hip_y - H * 0.01, x + hip_w, hip_y + H * 0.03), shade(pants, 0.6))  # belt
    p.circle(x - sh_w * 0.8, sh_y + H * 0.03, H * 0.035, shade(shirt, 1.05))
    p.circle(x + sh_w * 0.8, sh_y + H * 0.03, H * 0.035, shade(shirt, 1.05))
    p.poly([(x + facing * sh_w * 0.2, sh_y), (x + facing * sh_w, sh_y), (x + facing * hip_w, hip_y)],
           (0, 0, 0), alpha=0.15)  # side in shade
    # Neck and head.
    p.rect((x - H * 0.022, head_cy + head_r * 0.6, x + H * 0.022, sh_y + 2), shade(skin, 0.8))
    p.circle(x, head_cy, head_r, shade(skin, 1.05), shade(skin, 0.82))
    p.circle(x + facing * head_r * 0.95, head_cy + head_r * 0.1, head_r * 0.22, shade(skin, 0.9))  # nose
    p.ellipse((x - head_r * 1.05, head_cy - head_r * 1.1, x + head_r * 1.05, head_cy + head_r * 0.15),
              shade(hair, 1.1), shade(hair, 0.8))
    p.ellipse((x - facing * head_r * 1.05, head_cy - head_r * 0.8, x - facing * head_r * 0.1,
               head_cy + head_r * 0.75), hair)  # hair at the back of the head
    p.circle(x + facing * head_r * 0.45, head_cy - head_r * 0.05, head_r * 0.1, (30, 24, 22))  # eye
    # Front arm with hand, and an optional bag.
    hand = (x + facing * sh_w * 0.9 - swing * 1.3, hip_y + H * 0.07)
    p.line([(x + facing * sh_w * 0.7, sh_y + H * 0.03), (x + facing * sh_w - swing * 0.8, hip_y - H * 0.03),
            hand], arm_w, shirt, shade(shirt, 0.85))
    p.circle(hand[0], hand[1] + arm_w * 0.3, arm_w * 0.55, skin)
    if bag is not None:
        bx, by = hand[0], hand[1] + arm_w * 0.7
        p.line([(bx - H * 0.03, by + H * 0.02), (bx, by - H * 0.01), (bx + H * 0.03, by + H * 0.02)],
               H * 0.008, shade(bag, 0.6))
        p.rect((bx - H * 0.06, by + H * 0.02, bx + H * 0.06, by + H * 0.13), bag, shade(bag, 0.7),
               radius=H * 0.012)
    return hand


def car(p: Painter, x: float, ground: float, length: float, body: Color, *, facing: int = 1) -> None:
    """A side-view hatchback/sedan with its wheels on ``ground`` starting at ``x``."""
    L = length
    R = L * 0.105

    def X(u: float) -> float:  # u in [0, 1] along the car, front at u=1 when facing right
        return x + (u if facing == 1 else 1 - u) * L

    p.shadow(x + L / 2, ground, L * 0.55, R * 0.35, alpha=0.6)
    top_body, bottom_body = ground - L * 0.3, ground - R * 0.45
    # Lower body with a wedge front, and the cabin above it.
    p.poly([(X(0.0), bottom_body), (X(0.0), top_body + 6), (X(0.04), top_body), (X(0.93), top_body + 10),
            (X(1.0), top_body + 26), (X(1.0), bottom_body)], shade(body, 1.15), shade(body, 0.62))
    roof = top_body - L * 0.16
    p.poly([(X(0.16), top_body + 1), (X(0.3), roof), (X(0.63), roof), (X(0.79), top_body + 4)],
           shade(body, 1.2), shade(body, 0.9))
    # Windows (two panes split by the B-pillar) with a reflection streak.
    wy0, wy1 = roof + 6, top_body - 2
    p.poly([(X(0.21), wy1), (X(0.315), wy0), (X(0.45), wy0), (X(0.45), wy1)], (150, 178, 200), (40, 52, 66))
    p.poly([(X(0.48), wy1), (X(0.48), wy0), (X(0.615), wy0), (X(0.735), wy1)], (150, 178, 200), (40, 52, 66))
    p.poly([(X(0.35), wy0), (X(0.39), wy0), (X(0.33), wy1), (X(0.29), wy1)], (255, 255, 255), alpha=0.22)
    p.poly([(X(0.55), wy0), (X(0.6), wy0), (X(0.54), wy1), (X(0.49), wy1)], (255, 255, 255), alpha=0.18)
    # Body details: highlight along the shoulder, door seams, handles, sill, lights, bumpers.
    p.line([(X(0.03), top_body + 5), (X(0.93), top_body + 13)], 3, (255, 255, 255), alpha=0.35)
    for u in (0.465, 0.7):
        p.line([(X(u), top_body + 2), (X(u), bottom_body - 6)], 1.5, shade(body, 0.45), round_caps=False)
    for u in (0.4, 0.63):
        p.rect((min(X(u), X(u + 0.05)), top_body + 16, max(X(u), X(u + 0.05)), top_body + 20), shade(body, 0.5))
    p.rect((min(X(0.18), X(0.8)), bottom_body - 8, max(X(0.18), X(0.8)), bottom_body), (28, 28, 30))
    hx = X(0.985)
    p.ellipse((hx - 10, top_body + 24, hx + 8, top_body + 36), (255, 248, 220), (230, 210, 160))
    p.circle(hx, top_body + 30, 18, (255, 240, 200), alpha=0.3, blur=6)
    tx = X(0.012)
    p.rect((tx - 6, top_body + 10, tx + 6, top_body + 28), (220, 40, 40), (140, 20, 20), radius=3)
    for u in (0.0, 1.0):
        bx = X(u)
        p.rect((bx - 8, bottom_body - 14, bx + 8, bottom_body + 2), (36, 36, 38), radius=5)
    # Wheel arches and wheels.
    for u in (0.2, 0.8):
        cx, cy = X(u), ground - R
        p.circle(cx, cy, R * 1.18, (22, 22, 24))
        p.circle(cx, cy, R, (40, 40, 42), (16, 16, 18))
        p.circle(cx, cy, R * 0.62, (196, 198, 204), (110, 112, 120))
        for k in range(5):
            a = k * 2 * math.pi / 5 + 0.3
            p.line([(cx, cy), (cx + math.cos(a) * R * 0.55, cy + math.sin(a) * R * 0.55)], R * 0.12,
                   (90, 92, 98))
        p.circle(cx, cy, R * 0.16, (210, 212, 216))


def bicycle(p: Painter, x: float, ground: float, frame: Color) -> None:
    """A bicycle parked side-on, rear wheel at ``x``."""
    R = 34
    rear, front = (x, ground - R), (x + 112, ground - R)
    bb = (x + 48, ground - R + 4)
    seat = (x + 36, ground - R - 58)
    head = (x + 96, ground - R - 54)
    p.shadow(x + 56, ground, 80, 5, alpha=0.4)
    for cx, cy in (rear, front):
        p.ring(cx, cy, R, 5, (26, 26, 28))
        p.ring(cx, cy, R - 4, 1.5, (150, 150, 156))
        for k in range(12):
            a = k * math.pi / 6
            p.line([(cx, cy), (cx + math.cos(a) * (R - 4), cy + math.sin(a) * (R - 4))], 0.9,
                   (170, 172, 178), round_caps=False)
        p.circle(cx, cy, 3.5, (120, 120, 126))
    p.line([rear, bb, seat, rear], 4.5, frame)  # chain stay, seat tube, seat stay
    p.line([seat, head, bb], 4.5, frame)  # top tube, down tube
    p.line([head, front], 4, shade(frame, 0.8))  # fork
    p.circle(bb[0], bb[1], 7, (60, 60, 64))
    p.line([(bb[0] - 6, bb[1] + 12), (bb[0] + 6, bb[1] - 12)], 3, (40, 40, 44))  # crank
    p.line([(seat[0], seat[1]), (seat[0] - 3, seat[1] - 12)], 3, (80, 80, 84))
    p.rect((seat[0] - 14, seat[1] - 17, seat[0] + 10, seat[1] - 10), (30, 28, 28), radius=3)
    p.line([head, (head[0] - 2, head[1] - 14), (head[0] - 16, head[1] - 18)], 3.5, (50, 50, 54))


def dog(p: Painter, x: float, ground: float, fur: Color, *, facing: int = 1) -> None:
    """A medium dog standing side-on, body centred at ``x``."""
    f = facing
    body_y = ground - 46
    p.shadow(x, ground, 52, 5)
    legs = [(-30, 0.7), (28, 0.7), (-22, 1.0), (34, 1.0)]
    for dx, dim in legs:
        lx = x + f * dx
        p.line([(lx, body_y + 6), (lx + f * 2, ground - 4)], 9, shade(fur, dim * 0.95), shade(fur, dim * 0.7))
        p.ellipse((lx - 5 + f * 2, ground - 7, lx + 7 + f * 2, ground), shade(fur, 0.5))
    p.line([(x - f * 40, body_y - 4), (x - f * 56, body_y - 22), (x - f * 60, body_y - 34)], 6, fur)  # tail
    p.ellipse((x - 46, body_y - 18, x + 46, body_y + 18), shade(fur, 1.12), shade(fur, 0.7))
    hx, hy = x + f * 50, body_y - 26
    p.line([(x + f * 34, body_y - 4), (hx - f * 4, hy + 6)], 20, shade(fur, 1.0))  # neck
    p.circle(hx, hy, 15, shade(fur, 1.12), shade(fur, 0.8))
    p.ellipse((min(hx + f * 6, hx + f * 30), hy - 3, max(hx + f * 6, hx + f * 30), hy + 11),
              shade(fur, 1.05), shade(fur, 0.8))  # snout
    p.circle(hx + f * 29, hy + 1, 3.5, (20, 16, 16))  # nose
    p.circle(hx + f * 5, hy - 5, 2.4, (20, 16, 16))  # eye
    p.poly([(hx - f * 4, hy - 12), (hx - f * 14, hy - 4), (hx - f * 12, hy + 14), (hx - f * 2, hy + 4)],
           shade(fur, 0.55))  # ear
    p.rect((min(hx - f * 12, hx + f * 2), hy + 8, max(hx - f * 12, hx + f * 2), hy + 13), (180, 40, 40))


def finish(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Downsample, then add a vignette, a slight warm grade and sensor-like noise."""
    img = img.filter(ImageFilter.GaussianBlur(0.6)).resize((WIDTH, HEIGHT), Image.LANCZOS)
    a = np.asarray(img, dtype=np.float32)
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH]
    d = np.sqrt(((xx - WIDTH / 2) / (WIDTH / 2)) ** 2 + ((yy - HEIGHT / 2) / (HEIGHT / 2)) ** 2)
    a *= (1.0 - 0.16 * np.clip(d - 0.45, 0, None) ** 1.5)[..., None]
    a *= np.array([1.02, 1.0, 0.97], dtype=np.float32)
    luma_noise = rng.normal(0, 2.6, (HEIGHT, WIDTH, 1))
    chroma_noise = rng.normal(0, 1.0, (HEIGHT, WIDTH, 3))
    a += luma_noise + chroma_noise
    return Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8))


def make_scene(seed: int = SEED) -> Image.Image:
    """Paint the whole scene and return it as a 1280x720 RGB image."""
    rng = np.random.default_rng(seed)
    p = Painter(WIDTH, HEIGHT, SCALE)
    sky_and_backdrop(p, rng)
    buildings(p, rng)
    street(p, rng)
    tree(p, rng, 600)
    traffic_light(p, 1160)
    bicycle(p, 452, CURB - 8, (30, 110, 180))
    # Pedestrians on the sidewalk (the farther ones a little smaller and higher).
    person(p, 120, 492, 178, shirt=(40, 70, 130), pants=(40, 44, 56), skin=(224, 180, 150),
           hair=(60, 40, 30), stride=0.8, facing=1, bag=(120, 70, 40))
    person(p, 335, 486, 166, shirt=(36, 128, 140), pants=(200, 190, 170), skin=(170, 120, 90),
           hair=(20, 16, 16), stride=0.2, facing=-1, dress=True)
    hand = person(p, 668, 496, 182, shirt=(236, 236, 230), pants=(50, 80, 130), skin=(240, 200, 170),
           hair=(170, 120, 60), stride=0.9, facing=1)
    collar = (790 + 50 - 5, 494 - 46 - 26 + 10)
    sag = ((hand[0] + collar[0]) / 2, max(hand[1], collar[1]) + 14)
    p.line([hand, sag, collar], 1.4, (40, 30, 30))  # leash, drawn first so the dog covers its end
    dog(p, 790, 494, (150, 100, 56), facing=1)
    person(p, 905, 488, 170, shirt=(70, 130, 80), pants=(36, 36, 40), skin=(120, 84, 62),
           hair=(16, 14, 14), stride=0.0, facing=-1)
    person(p, 968, 490, 160, shirt=(230, 170, 50), pants=(60, 60, 70), skin=(236, 196, 160),
           hair=(110, 70, 40), stride=0.5, facing=-1, bag=(50, 50, 60))
    # Traffic: two cars in the far lane (one cut by the frame edge), one in the near lane.
    car(p, 36, 596, 330, (186, 30, 36), facing=1)
    car(p, 1040, 590, 300, (220, 222, 226), facing=-1)
    car(p, 420, 690, 380, (30, 70, 130), facing=1)
    return finish(p.img, rng)


def main() -> None:
    default = Path(__file__).resolve().parents[1] / "libreyolo" / "assets" / "sample.jpg"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default, help=f"output file (default {default})")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    make_scene().save(args.out, format="JPEG", quality=QUALITY, optimize=True)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
