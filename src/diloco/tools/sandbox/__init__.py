"""The grader's sandbox: the allow-list root, the worker process and the strict plain-data wire to it."""
