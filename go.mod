module unbounded-cloud.io/agent

go 1.26
