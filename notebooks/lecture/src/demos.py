# %% [markdown]
# # Live demos for a lecture
#
# Two cells to run in front of the class (JupyterLab, `Shift+Enter`), each a few
# seconds on a laptop CPU. Run the set-up cell before the lecture starts.
# `docs/teaching.md` says when to use each.

# %%
from minillm.book import lecture, widgets

# %% [markdown]
# ## Demo 1 (chapter 0): the stall, measured now, and its cure
#
# Four streams are decoding when a 1024-token prompt arrives. The real engine
# serves it twice with the built-in tiny model: without chunking, then with
# 256-token chunks. Ask the class first: *what will the streams' worst gap be?*

# %%
# NBVAL_IGNORE_OUTPUT
lecture.stall_demo(prompt_len=1024, num_decoders=4, chunk_size=256)

# %% [markdown]
# ## Demo 2 (chapter 7): the lab
#
# Llama-3-8B on a simulated A100 by default. Move the chunk size from "off" to 16
# and back up to 4096; switch the GPU; tighten the ITL target. Ask before each move
# which way TTFT and the worst gap will go.

# %%
# NBVAL_IGNORE_OUTPUT
widgets.lab()
