"""Pictures and pages made from the analysis' frames: the dataset's plots (`plots/`) and the HTML
report (`report`), an audit's lines and pages (`audit`), a cold-start breakdown (`coldstart`), text tables
(`text`)."""
