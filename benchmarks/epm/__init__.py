"""EPM benchmark (Echo-N1's dynamic EQ evaluation, published as EMPA): a person with a story, a director,
a rater, and the dialogue as a path in cognitive / affective / proactive space (:mod:`.run`)."""
