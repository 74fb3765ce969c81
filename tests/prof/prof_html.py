#!/usr/bin/env python3
"""Renders the HTML report of tests/prof/prof_stats in headless Chromium to a PNG and checks that it
is not blank (enough non-background pixels, several colours, the bar colours present). An empty
page is rendered too and must be judged blank, so the check can fail. Exit 77 (skip) where no
Chromium is installed. Before that (also without Chromium), the step-time plot is checked
against report.json: one point per step of the statistics, x rising across the plot, the
highest step at the top, the p50 / p99 lines where the JSON's numbers put them.
With --advice PROF_ADVICE_EXE, the timeline's GPU activity rows of tests/prof/prof_advice's report
(injected kernels and copies, no GPU needed) are rendered too and must show the GPU boxes' green,
which the same page without those rows lacks.
Usage: prof_html.py PROF_STATS_EXE [KEEP_PNG] [--advice PROF_ADVICE_EXE]"""
import json, os, re, shutil, struct, subprocess, sys, tempfile, zlib


def check_steps_plot(d):
    """The step plot (svg.steps) against report.json's steps; returns a list of failures."""
    fails = []
    page = open(os.path.join(d, "report.html")).read()
    rep = json.load(open(os.path.join(d, "report.json")))
    st = rep["steps"]["step"]
    m = re.search(r'<svg class="steps" height="(\d+)"(.*?)</svg>', page, re.S)
    if not m:
        return ["no step plot (svg.steps) in report.html"]
    h, svg = int(m.group(1)), m.group(2)
    lines = re.findall(r'<polyline class="series" fill="none" stroke="([^"]+)"[^>]*points="([^"]*)"', svg)
    step = [pts for col, pts in lines if col == "#222"]
    if len(step) != 1:
        return ["the step time polyline: %d found" % len(step)]
    pts = [tuple(map(float, p.split())) for p in re.findall(r"[-\d.]+ [-\d.]+", step[0])]
    if len(pts) != st["steps"]:
        fails.append("step polyline: %d points for %d steps" % (len(pts), st["steps"]))
    xs = [p[0] for p in pts]
    if xs and (xs[0] != 0 or xs[-1] != 1000 or any(b <= a for a, b in zip(xs, xs[1:]))):
        fails.append("step polyline x: not rising from 0 to 1000")
    ys = [p[1] for p in pts]
    if ys and abs(min(ys) - 2.0) > 0.06:  # the step time holds the plot's maximum (zones lie inside steps)
        fails.append("the longest step is not at the top (y %s)" % min(ys))
    for q in ("p50", "p99"):
        lm = re.search(r'<line x1="0" x2="1000" y1="([-\d.]+)"[^>]*><title>step time %s' % q, svg)
        want = h - (h - 2) * st[q + "_ns"] / st["max_ns"]
        if not lm or abs(float(lm.group(1)) - want) > 0.06:
            fails.append("the %s line at %s, want %.1f" % (q, lm.group(1) if lm else None, want))
    print("step plot: %d points, %d series" % (len(pts), len(lines)))
    return fails

def png_pixels(path):
    """Minimal PNG decoder (8-bit RGB/RGBA, non-interlaced): rows of (r, g, b) tuples."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, typ = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError("unsupported PNG layout %d/%d/%d" % (depth, ctype, interlace))
            bpp = 3 if ctype == 2 else 4
        elif typ == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev, o = [], bytearray(stride), 0
    for _ in range(h):
        f = raw[o]
        cur = bytearray(raw[o + 1:o + 1 + stride])
        o += 1 + stride
        for i in range(stride):
            a = cur[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1: cur[i] = (cur[i] + a) & 255
            elif f == 2: cur[i] = (cur[i] + b) & 255
            elif f == 3: cur[i] = (cur[i] + ((a + b) >> 1)) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(cur[i:i + 3]) for i in range(0, stride, bpp)])
        prev = cur
    return rows

def judge(rows):
    from collections import Counter
    cnt = Counter(p for r in rows[::2] for p in r[::2])
    total = sum(cnt.values())
    bg, nbg = cnt.most_common(1)[0]
    non_bg = 1 - nbg / total
    blue = sum(v for p, v in cnt.items() if abs(p[0] - 0x4e) < 12 and abs(p[1] - 0x79) < 12 and abs(p[2] - 0xa7) < 12)
    return non_bg, len(cnt), blue / total

def render(chrome, html, png, size="1000,1400"):
    cmd = [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=" + size,
           "--screenshot=" + png, "file://" + html]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or not os.path.exists(png):
        print(r.stderr[-2000:])
        raise RuntimeError("chromium failed")

def green(rows):
    """Pixels of the GPU boxes' green (.gpu #59a14f, blended with white by the strokes and the
    box widths): clearly more green than red and blue."""
    return sum(1 for r in rows for p in r if p[1] > p[0] + 30 and p[1] > p[2] + 30)

def check_activity_lanes(chrome, exe, d):
    """The timeline's GPU activity rows (tests/prof/prof_advice's injected kernels and copies)
    render: the report has GPU-green pixels, the same page without its CUPTI rows has (almost)
    none (prof_advice records no GPU zone: the green comes from those rows). Returns failures."""
    import re
    r = subprocess.run([exe, d], capture_output=True, text=True)
    if r.returncode != 0:
        return ["%s exited %d" % (exe, r.returncode)]
    page = open(os.path.join(d, "report.html")).read()
    rows = re.compile(r'<div class="lbl" title="[^"]*\(CUPTI\)">.*?</svg>\n', re.S)
    if len(rows.findall(page)) != 2:
        return ["prof_advice's report: %d CUPTI timeline rows, want 2" % len(rows.findall(page))]
    open(os.path.join(d, "stripped.html"), "w").write(rows.sub("", page))
    # the timeline sits below the advice and the charts: a tall window
    render(chrome, os.path.join(d, "report.html"), os.path.join(d, "act.png"), "1000,5000")
    render(chrome, os.path.join(d, "stripped.html"), os.path.join(d, "stripped.png"), "1000,5000")
    g, g0 = green(png_pixels(os.path.join(d, "act.png"))), green(png_pixels(os.path.join(d, "stripped.png")))
    print("GPU activity rows: %d green pixels, %d without the rows" % (g, g0))
    if g < 100 or g0 * 20 > g:
        return ["the timeline's GPU activity rows did not render (%d green pixels, %d without them)" % (g, g0)]
    return []

def main():
    chrome = next((shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)
    advice = None
    if "--advice" in sys.argv:
        i = sys.argv.index("--advice")
        advice = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.argv[1], d], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr)
            return 1
        plot_fails = check_steps_plot(d)
        for f in plot_fails:
            print("FAIL:", f)
        if plot_fails:
            return 1
        if not chrome:
            print("no chromium: the rendering check skipped")
            return 77
        blank = os.path.join(d, "blank.html")
        open(blank, "w").write("<!DOCTYPE html><html><body></body></html>")
        render(chrome, os.path.join(d, "report.html"), os.path.join(d, "report.png"))
        render(chrome, blank, os.path.join(d, "blank.png"))
        nb, ncol, blue = judge(png_pixels(os.path.join(d, "report.png")))
        bnb, bncol, bblue = judge(png_pixels(os.path.join(d, "blank.png")))
        print("report: %.1f%% non-background, %d colours, %.2f%% bar colour" % (100 * nb, ncol, 100 * blue))
        print("blank : %.1f%% non-background, %d colours" % (100 * bnb, bncol))
        if len(sys.argv) > 2:
            shutil.copy(os.path.join(d, "report.png"), sys.argv[2])
        ok = nb > 0.03 and ncol >= 8 and blue > 0.005
        ok_blank = not (bnb > 0.03 and bncol >= 8)
        if not ok_blank:
            print("FAIL: the blank page was judged non-blank: the check is broken")
        if not ok:
            print("FAIL: the report rendered blank")
        act_fails = []
        if advice:
            ad = os.path.join(d, "advice")
            os.makedirs(ad)
            act_fails = check_activity_lanes(chrome, advice, ad)
            for f in act_fails:
                print("FAIL:", f)
        return 0 if ok and ok_blank and not act_fails else 1

sys.exit(main())
