"""The experiment's figure (`figure`), the estimated cost map (`costmap`), and its section of the model report:
what the runs say (`summary`) and its pages (`pages`). They read the document `qkinspect.experiment.saved` checked."""
