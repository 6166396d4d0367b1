"""ESConv benchmarks: ``esconv`` (PPDPP's interactive protocol: a simulated seeker, a critic;
:mod:`.interactive`) and ``esconv-ref`` (the policy's reply against the real supporter turn;
:mod:`.reference`)."""
