"""LightGBM LambdaRank coarse ranker over recall candidates."""
