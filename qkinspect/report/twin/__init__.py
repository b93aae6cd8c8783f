"""The twin's figures and report pages (docs/twin.md): `figures`, the PDF report (`pdf`), the HTML report (`html`)."""
