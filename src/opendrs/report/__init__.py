"""Reports of a plan, a simulation or a daemon's history: text for the terminal
(:mod:`.text`), HTML and Markdown through templates (:mod:`.render`)."""

#: Report formats: a self-contained HTML page, or Markdown (here, so that a command line lists
#: them without importing the templates' modules).
FORMATS = ("html", "md")
