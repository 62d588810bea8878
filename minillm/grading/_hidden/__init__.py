"""Hidden cases for the grader (teacher only; a student release strips this folder).

`_hidden/chNN.py` holds, for each public checker `check_x` of `minillm/grading/chNN.py`,
`HIDDEN["check_x"]`: a list of keyword arguments (seeds and shapes the student never saw)
the grader passes to the public checker, and where useful `hidden_check_x(fn)`, which
compares the student's function with `_reference/chNN.py` on other shapes.
"""
