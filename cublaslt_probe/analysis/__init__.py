"""What the tool concludes from what the GPU code wrote; it imports no GPU code. The dataset and its evidence
(`dataset`, `evidence`, `candidates`, `explain`, `diff`), traces (`trace/`), programs (`audit/`,
`steps`, `graphs`, `grouped`, `stalls`), proofs of advice (`proof`) and first steps (`coldstart/`: the runs that
`gpu.coldstart` made in GPU children, read and explained)."""
