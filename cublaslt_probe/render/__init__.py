"""Pictures and pages made from the analysis' frames: the dataset's plots (`plots/`) and the HTML
report (`report`)."""
