"""The analysis's figures (`figures`, `curves`), its plain-words summary (`summary`) and the model report: its
text (`text`), PDF (`pdf`) and web page (`html`), with the analysis records read into arrays (`arrays`) and its
per-layer tables (`tables`)."""
