"""The experiment's figure (`figure`), the estimated cost map (`costmap`), the healing curves (`healing`), and its
section of the model report (`pages`), drawn and written from the experiment's records (`run_experiment`'s result,
or the document `qkinspect.experiment.saved` reads back); what the runs cost is `qkinspect.experiment.costs`'."""
