"""EPM benchmark (Echo-N1's dynamic EQ evaluation, published as EMPA): a person with a story, a director,
a rater, and the dialogue as a path in cognitive / affective / proactive space.

* :mod:`.vectors` -- the EPM vector math and EPM-Q (pure functions, :class:`.vectors.EpmConfig`).
* :mod:`.data` -- our persona cards (``epm_en.json`` beside it) and EMPA's case files.
* :mod:`.user` / :mod:`.director` -- the person and the director (the benchmark's role players).
* :mod:`.judge` -- the rater that fills the IEDR and MDEP forms.
* :mod:`.run` -- the episode loop (:class:`.run.Epm`).
* :mod:`.recompute` -- the same records from EMPA's published result files.
* :mod:`.report` -- the EPM section of the HTML report.
"""
