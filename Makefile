.PHONY: run check test
run:
	bash scripts/run.sh
check:
	bash scripts/check.sh
test:
	bash scripts/test.sh
