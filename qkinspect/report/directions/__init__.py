"""The directions' pages: the PDF of the tokens each head's directions read (`pdf`)."""
