"""Hidden cases for the grader (teacher only: a student release strips this folder).

`minillm/grading/_hidden/chNN.py` holds, for each public checker of chapter NN,
`HIDDEN = {"check_name": [dict(seed=...), ...]}`: keyword arguments of cases the
student never saw, which `python -m minillm grade` runs after the public check.
"""
