"""The figures read at projector size (a deck fits a figure into 1280x520 pixels of a
1280x720 slide): every text at least figures.MIN_TEXT_PX tall there; the roofline's labels
never overlap and every device's line shows, even where two coincide; streams with the
same token gaps stay visible, as stripes. Cost: about 6 s (the README's four figures and
the chapter-7 lab, simulated)."""
import pytest
from matplotlib.figure import Figure

from minillm.book import figures, lab
from minillm.sim import hardware


def _texts(fig: Figure):
    fig.draw_without_rendering()
    for ax in fig.axes:
        yield from (t for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text())
        yield from (t for t in (ax.xaxis.label, ax.yaxis.label, ax.title, *ax.texts) if t.get_text())
        if ax.get_legend() is not None:
            yield from ax.get_legend().get_texts()
    yield from (t for t in fig.texts if t.get_text())


SETTINGS = lab.LabSettings(model="llama-3-8b", hardware="A100-80GB", chunk_size=512)
FIGURES = {
    "stall_timeline": lambda: lab.plot_stall(SETTINGS, chunk_size=512),
    "ttft_tpot_vs_chunk": lambda: figures.plot_chunk_sweep(lab.chunk_sweep(SETTINGS), current=512, itl_slo_ms=50),
    "load_lab": lambda: lab.lab_figure(SETTINGS, workload="chat", rate_per_s=4.0, itl_slo_ms=100.0),
    "interference_lab": lambda: lab.lab_figure(SETTINGS, chunk_size=256),
    "roofline": lambda: figures.plot_roofline("llama-3-8b", "A100-80GB"),
    "rooflines": lambda: figures.plot_rooflines(list(hardware.PROFILES.values()), CHAPTER5_STEPS),
}
# chapter 5's steps (FLOPs per byte of Llama-3-8B, its section 4): two of them 5% apart
CHAPTER5_STEPS = {"decode x32 (ctx 1024)": 25.3, "prefill chunk 512": 400.0,
                  "mixed: chunk 512 + 32 decodes": 381.0, "prefill chunk 2048": 1480.0}


@pytest.mark.parametrize("name", FIGURES)
def test_every_text_of_a_figure_is_readable_on_a_slide(name):
    fig = FIGURES[name]()
    smallest = figures.min_font_points(fig)
    small = [(t.get_text()[:40], round(t.get_fontsize(), 1)) for t in _texts(fig) if t.get_fontsize() < smallest - 1e-6]
    assert not small, f"{name}: texts under {smallest:.1f} pt ({figures.MIN_TEXT_PX:g} px on a slide): {small[:5]}"
    assert figures.overlapping_texts(fig) == [], name


def test_every_device_of_the_rooflines_shows_and_no_label_hides_another():
    profiles = list(hardware.PROFILES.values())
    fig = figures.plot_rooflines(profiles, CHAPTER5_STEPS)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert len(lines) == len(profiles) and len(ax.get_legend().get_texts()) == len(profiles)
    forty, h200 = (next(line for label, line in lines.items() if label.startswith(name)) for name in ("A100-40GB", "H200"))
    assert abs(hardware.PROFILES["A100-40GB"].ridge_point / hardware.PROFILES["H200"].ridge_point - 1) < 0.05
    # the two lines coincide: the one drawn first is wider and the later one has its own dashes
    assert forty.get_linewidth() > h200.get_linewidth() + 1 and forty.get_linestyle() != h200.get_linestyle()
    assert len({line.get_linestyle() for line in lines.values()}) == len(profiles)
    assert figures.overlapping_texts(fig) == []
    assert {t.get_text() for t in ax.texts} == set(CHAPTER5_STEPS)


def test_streams_with_the_same_gaps_are_drawn_as_stripes_with_one_legend_entry():
    run = lab.lab_run(SETTINGS)
    fig = figures.plot_token_gaps(run.outputs, tag="decoder")
    lines = fig.axes[0].get_lines()
    assert len(lines) == SETTINGS.num_decoders                         # one line per stream, still
    widths = [line.get_linewidth() for line in lines]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == len(widths)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == \
        [f"requests 0-{SETTINGS.num_decoders - 1}: the same gaps"]
