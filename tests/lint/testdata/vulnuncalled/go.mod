module example.com/vulnuncalled

go 1.26.0

require golang.org/x/text v0.3.7
