"""ESConv benchmarks: ``esconv`` (PPDPP's interactive protocol: a simulated seeker, a critic) and
``esconv-ref`` (the policy's reply against the real supporter turn).

* :mod:`.data` -- whole conversations for the benchmark, read by the one ESConv parser in
  :mod:`rapo_echo.data.esconv`.
* :mod:`.seeker` -- the seeker and critic prompts (the benchmark's role players).
* :mod:`.interactive` -- the interactive episode loop and its success rate.
* :mod:`.reference` -- the reference-based scores (BLEU, ROUGE-L, Distinct-n).
"""
