"""An atlas's pages: its figures against depth and size (`figures`), its PDF report (`pdf`) and its HTML report
(`html`), drawn from its records (`qkinspect.atlas`)."""
